"""The `deepspark` drafter's options (its rule: deepspark.py; docs/plugins.md)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from deepinfer_builtin.drafters.draft_model.drafter import DraftModelOptions


class DeepSparkOptions(DraftModelOptions):
    min_value: float = Field(0.05, ge=0.0, le=1.0, description="verify draft j while the estimated chance "
                             "that drafts 1..j are all accepted is at least this")
    verify_budget: int = Field(0, ge=0, description="draft tokens verified per step over the batch (0: no cap)")
    early_stop: bool = Field(True, description="stop drafting a request once its latest draft falls below "
                                               "min_value: no later draft of it could be verified")
    cost_aware: bool = Field(True, description="end a round's drafting once another draft step is expected "
                                               "to add tokens more slowly than the round so far (from "
                                               "measured step times; drafts then vary with timing, never "
                                               "the greedy output)")
    depth_margin: float = Field(0.3, ge=0.0, lt=1.0, description="with cost_aware: draft on while another step "
                                "adds tokens over (1 - depth_margin) times as fast as the round so far")
    verify_all_in_graphs: bool = Field(True, description="when the engine verifies in device graphs (k + 1 rows a "
                                                        "request, computed whether verified or not), verify every "
                                                        "drafted token and leave the choice to the round depth")
    skip_when_slower: Literal["graphs", "always", "never"] = Field(
        "always", description="draft nothing for a round (a plain decode step) unless speculative rounds are "
                              "measured to give more tokens a second than plain steps at this batch size (by "
                              "skip_margin to start): 'always', 'graphs' (in device graphs only), 'never'")
    skip_min_batch: int | None = Field(None, ge=1, description="with skip_when_slower: only batches of at least "
                                       "this many requests skip (smaller ones always speculate); by default 1 "
                                       "where the engine verifies in device graphs, 8 elsewhere")
    skip_margin: float = Field(0.15, ge=0.0, lt=1.0, description="with skip_when_slower: how much faster "
                               "speculative rounds must be measured than plain steps to be chosen (to start or "
                               "to take over); plain steps take over as soon as they are the faster")
    explore_every: int = Field(16, ge=2, description="with skip_when_slower: after this many rounds, four of "
                                                     "the slower kind, so that both stay measured (the gap "
                                                     "doubles with every look that finds the same kind faster, "
                                                     "to at least twice the run it ends; up to 1,024)")
    warmup_tokens: int = Field(12, ge=0, description="with skip_when_slower: a speculative round is measured only "
                               "if at most a quarter of its requests have generated fewer tokens than this (a "
                               "request's first tokens accept the fewest drafts); a look at speculating runs up "
                               "to eight rounds longer instead, after which its rounds are measured")
    overlap_plain_rounds: bool = Field(True, description="with skip_when_slower: tell the engine before each round "
                                                         "whether it drafts, so that rounds that draft nothing keep "
                                                         "overlap scheduling (on devices that run queued work "
                                                         "asynchronously)")
    lookup: bool = Field(True, description="where the context holds an earlier occurrence of its last tokens, "
                                           "propose what followed it instead of running the draft model, where "
                                           "that is expected to pay better (lookup.py; off where rounds chain)")
    lookup_max_batch: int = Field(2, ge=1, description="with lookup: only rounds of fewer requests look up (by "
                                                       "default of one: in larger batches, mixed rounds and the "
                                                       "search for every request cost more than they save)")
    lookup_max_n: int = Field(4, ge=1, description="with lookup: the longest suffix looked up")
    lookup_min_n: int = Field(2, ge=1, description="with lookup: the shortest suffix looked up")
    learn_per_round: int = Field(16, ge=1, description="the acceptance tables learn from about this many requests' "
                                 "verifications a round at most, in turn (others' cost host time, sharpen nothing)")
    buckets: int = Field(10, ge=1, le=100)
    prior_strength: float = Field(4.0, gt=0.0)

    @model_validator(mode="after")
    def _lookup_order(self) -> DeepSparkOptions:
        if self.lookup_min_n > self.lookup_max_n:
            raise ValueError(f"lookup_min_n ({self.lookup_min_n}) must not exceed lookup_max_n ({self.lookup_max_n})")
        return self
