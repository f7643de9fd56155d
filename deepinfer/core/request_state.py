"""Per user request: its n sequences, their detokenizers, stop checks and the RequestOutput."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from deepinfer.core.detokenizer import IncrementalDetokenizer
from deepinfer.core.request import CompletionOutput, Request, RequestOutput, RequestStatus


def stops_on_token(req: Request, token: int) -> bool:
    """Whether ``token`` (just appended) ends the request as an EOS or one of its stop token ids
    (once it has ``min_tokens`` output tokens)."""
    p = req.params
    return req.num_output_tokens >= p.min_tokens and (
        (not p.ignore_eos and token in req.eos_token_ids) or token in p.stop_token_ids)


def check_stop(req: Request, token: int, stop_str: str | None, on_token: bool) -> bool:
    """Set the request's finished status if ``token`` (just appended) ends it; ``on_token``:
    ``stops_on_token(req, token)``, which the caller has needed already."""
    p = req.params
    if on_token:
        req.status = RequestStatus.FINISHED_STOPPED
        if token in p.stop_token_ids and (p.ignore_eos or token not in req.eos_token_ids):
            req.stop_reason = token
        return True
    if stop_str is not None:
        req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, stop_str
        return True
    if (p.max_tokens is not None and req.num_output_tokens >= p.max_tokens) or req.num_tokens >= req.max_model_len:
        req.status = RequestStatus.FINISHED_LENGTH
        return True
    return False


@dataclass(slots=True)
class RequestState:
    """One user request as the engine reports it; its sequences run as separate Requests."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Request]
    detoks: list[IncrementalDetokenizer]
    arrival_time: float = field(default_factory=time.monotonic)

    @property
    def finished(self) -> bool:
        return all(s.status.finished for s in self.seqs)

    def to_output(self) -> RequestOutput:
        outs = []
        for i, (seq, detok) in enumerate(zip(self.seqs, self.detoks, strict=True)):
            done = seq.status.finished
            outs.append(CompletionOutput(
                index=i,
                text=detok.visible_text(done),
                token_ids=list(seq.output_token_ids),
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
                logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None,
                cumulative_logprob=(sum(next(iter(lp.values())) for lp in seq.logprobs if lp)
                                    if seq.params.logprobs is not None else None),
            ))
        first = self.seqs[0]
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=outs,
            finished=self.finished,
            prompt_logprobs=list(first.prompt_logprobs) if first.params.prompt_logprobs is not None else None,
            num_cached_tokens=max(0, first.num_cached_tokens),
            metrics={"arrival_time": self.arrival_time,
                     "first_token_time": first.first_token_time or 0.0},
        )
