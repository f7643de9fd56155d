"""The five slots of deepinfer: what a device, attention backend, cache policy, drafter and
scheduler each own. Built-in and third-party plugins implement these the same way; what only some
plugins of a slot do is an optional capability (``deepinfer.core.capabilities``)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from deepinfer.core.block_pool import Block
    from deepinfer.core.context import EngineContext
    from deepinfer.core.fused_ops import FusedOps
    from deepinfer.core.host_copy import HostCopy
    from deepinfer.core.request import Request
    from deepinfer.core.step_batch import StepBatch


class NoOptions(BaseModel):
    """Options model of a plugin that takes none."""

    model_config = ConfigDict(extra="forbid")


class Plugin:
    """Common shape of every slot plugin: a name, an options model, and a constructor
    ``(options, ctx)``. ``unavailable_reason`` says why it cannot run here (None: it can)."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, options: BaseModel, ctx: EngineContext) -> None:
        self.options = options
        self.ctx = ctx

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None


# ----------------------------------------------------------------------------------------- device
class Device(Plugin, ABC):
    """One kind of accelerator (or the CPU): presence, memory budget, streams and defaults."""

    #: higher wins when ``device: auto`` finds several usable plugins
    specificity: ClassVar[int] = 0
    #: the attention plugin used when the config names none
    default_attention: ClassVar[str] = "torch"
    dist_backend: ClassVar[str] = "gloo"
    #: queued work runs on while the host goes on (accelerators); where it does not (the CPU),
    #: the engine does not overlap scheduling with execution, which could only add bookkeeping
    asynchronous: ClassVar[bool] = True

    @property
    @abstractmethod
    def torch_device(self) -> torch.device: ...

    @abstractmethod
    def kv_cache_budget(self, model_bytes: int) -> int:
        """Bytes the KV pool may take once the model's weights are loaded."""

    def synchronize(self) -> None:
        """Wait for queued work on the device."""

    def fused_ops(self) -> FusedOps | None:
        """Fused kernels the models (and the core's sampling and graph replays) should use here, or
        None (the default): plain torch. See ``FusedOps`` for what each kernel does and which are
        optional."""
        return None

    def linear_op(self, dtype: torch.dtype) -> Callable[..., torch.Tensor] | None:
        """The matmul the linear layers and LM head of a model of ``dtype`` should use here, as
        ``fn(x, weight, bias=None)`` with ``F.linear``'s meaning and result, or None (the default):
        torch's ``F.linear``. For devices whose own matmul is slow for some dtype or shape, or that
        compute rows batch-invariantly (``batch_invariant``); then it carries ``batched(x, w)``, a
        ``torch.bmm`` alike for models' per-head products (MLA's absorbed projections)."""
        return None

    def draft_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a draft model of a ``dtype`` target runs in here when its plugin is left to
        choose (a draft runs mostly steps of one token a sequence): the target's by default."""
        return dtype

    def batch_invariance_unavailable(self) -> str | None:
        """Why this device cannot run the engine's ``batch_invariant`` mode, or None where it can:
        under it (``ctx.config.batch_invariant``) its matmuls and reductions (``linear_op``,
        ``fused_ops``) compute every row in an order that does not depend on the other rows."""
        return f"device plugin {self.name!r} does not implement it"

    def graphs(self) -> DeviceGraphs | None:
        """Graph capture on this device (decode steps are then recorded once per batch size and
        replayed), or None: every step runs eagerly."""
        return None


class DeviceGraphs(ABC):
    """Records a function's device work once and replays it; inputs are read from, and outputs
    written to, the same tensors on every replay. Captures share one memory pool, so capture the
    largest batch first."""

    @abstractmethod
    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """Warm ``fn`` up, record it, and return ``(replay, output)``; each ``replay()`` recomputes
        ``output`` in place from the current contents of the tensors ``fn`` read, and every other
        tensor the recorded call made too (``DecodeGraphs``' greedy head reads one)."""


# -------------------------------------------------------------------------------------- attention
@dataclass(frozen=True, slots=True)
class AttentionLayerSpec:
    """What one attention layer needs from the KV cache."""

    layer_idx: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None  # a token attends to itself and the W-1 before it
    scale: float = 1.0
    #: its KV group (``KVGroupSpec``): the pool and block table it uses; 0, or 1 for sliding-window
    #: layers when a cache policy keeps them apart (``SeparatesWindowedKV``)
    kv_group: int = 0
    #: a latent KV layer (MLA in its absorbed form): the value is the first ``value_dim`` dims of
    #: the key, so the cache stores keys alone and ``forward`` takes ``v=None`` and returns
    #: [T, num_heads, value_dim]. None: keys and values are cached apart, as usual
    value_dim: int | None = None

    @property
    def latent(self) -> bool:
        return self.value_dim is not None


class AttentionBackend(Plugin, ABC):
    """KV-cache layout, per-step metadata and the attention forward over the paged cache."""

    #: decode-only steps may be captured in a device graph: for a StepBatch whose
    #: ``max_query_len`` is 1, ``build_metadata`` and ``forward`` read only its device tensors
    #: (a sequence of length 0 is padding: its output is ignored and a negative slot is never
    #: written) and take ``max_seq_len`` as an upper bound, never as the exact maximum
    supports_graphs: ClassVar[bool] = False
    #: reads each layer's block table and slots from ``StepBatch.kv_groups[layer.kv_group]`` and
    #: skips negative slots, so each KV group (``KVGroupSpec``) may keep a pool of its own, as a
    #: cache policy that ``SeparatesWindowedKV`` asks
    supports_kv_groups: ClassVar[bool] = False
    #: serves latent KV layers (``AttentionLayerSpec.value_dim``): one cache tensor of keys per
    #: layer, the values read as the keys' first ``value_dim`` dims; the engine refuses a model
    #: with such layers on a backend without it
    supports_latent_kv: ClassVar[bool] = False

    def batch_invariance_unavailable(self) -> str | None:
        """Why this backend cannot run the engine's ``batch_invariant`` mode, or None where it can:
        under it (``ctx.config.batch_invariant``) a query row's attention is computed the same way
        whatever else the step holds, and whether the row comes in a prefill, a chunk of one, a
        decode, a verification or after a cached prefix."""
        return f"attention plugin {self.name!r} does not implement it"

    @abstractmethod
    def kv_cache_bytes_per_block(self, layers: Sequence[AttentionLayerSpec], block_size: int,
                                 dtype: torch.dtype) -> int:
        """Bytes one block costs across all layers."""

    @abstractmethod
    def allocate_kv_cache(self, layers: Sequence[AttentionLayerSpec], num_blocks: int,
                          block_size: int, dtype: torch.dtype, device: torch.device) -> list[Any]:
        """One cache object per layer."""

    @abstractmethod
    def build_metadata(self, batch: StepBatch) -> Any:
        """Per-step metadata, built once and handed to every layer."""

    @abstractmethod
    def forward(self, layer: AttentionLayerSpec, q: torch.Tensor, k: torch.Tensor | None,
                v: torch.Tensor | None, kv_cache: Any, metadata: Any) -> torch.Tensor:
        """Write k/v into the cache at the step's slots, attend; q is [T, H, D], returns [T, H, D].
        k and v are None only where the backend offered its cache to the device's fused qkv kernel
        (``FusedKVWrite``): they are written already. For a latent layer (``layer.value_dim``) v is
        None, k is [T, 1, D] and the result is [T, H, value_dim]."""


# ----------------------------------------------------------------------------------- cache policy
class PrefixMatch(NamedTuple):
    """Blocks a request can start from and how many of its tokens need no computing. ``wait``: another
    running request is computing the blocks that come next, so admitting this one later reuses them.

    With sliding-window layers in a KV pool of their own, ``window_blocks`` are that pool's blocks
    holding the window before ``num_tokens`` (the last ends there), and ``replay_until`` > num_tokens
    says ``blocks`` hold full-attention KV up to it: tokens num_tokens..replay_until run through the
    model again (a replay) without rewriting that KV."""

    blocks: list[Block]
    num_tokens: int
    wait: bool = False
    window_blocks: tuple[Block, ...] = ()
    replay_until: int = 0


class CachePolicy(Plugin, ABC):
    """Which KV blocks outlive their request, and which a new request may reuse."""

    def match(self, request: Request, previous: PrefixMatch) -> PrefixMatch:
        """Cached blocks to start from; ``previous`` is what earlier policies in the stack found.
        Asked at every admission; the manager drops the stack's match for a request that wants
        prompt logprobs (``request.params.prompt_logprobs``: every prompt position is computed)."""
        return previous

    def on_computed(self, request: Request, blocks: list[Block]) -> None:
        """The request's KV now covers ``request.num_computed_tokens`` tokens."""

    def on_free(self, request: Request, blocks: list[Block]) -> None:
        """The request is letting go of ``blocks``: keep hashes on what should stay cached."""

    def on_evict(self, block: Block) -> None:
        """The pool is reusing a block that still carried this policy's hash."""


# ---------------------------------------------------------------------------------------- drafter
class DeviceTokens:
    """Draft tokens still on the device, their copy to the host under way. A proposal whose
    ``source`` this is holds placeholders: token -(r+1) stands for ``tokens[r]``. The engine feeds
    the placeholders to the verification step on the device, so the host need not wait for the
    drafts before preparing that step, and reads the values (``values``, from ``fetch``) only once
    the verification has been waited for anyway."""

    __slots__ = ("_fetch", "_values", "tokens")

    def __init__(self, tokens: torch.Tensor, fetch: Callable[[], list[int]]) -> None:
        self.tokens = tokens  # [n] int64, on the device
        self._fetch = fetch   # the n values on the host (waits for their copy)
        self._values: list[int] | None = None

    def values(self) -> list[int]:
        if self._values is None:
            self._values = self._fetch()
        return self._values

    def resolve(self, tokens: Sequence[int]) -> list[int]:
        """``tokens`` with each placeholder replaced by its value."""
        values = self.values()
        return [values[-t - 1] if t < 0 else t for t in tokens]


@dataclass(frozen=True, slots=True)
class DraftProposal:
    """Draft tokens for one request. ``probs`` [len(tokens), vocab] is the draft distribution each
    token was drawn from (None: a deterministic proposal, taken as one-hot); only the first
    ``num_verify`` tokens (None: all) are sent to the target (0: none, the step a plain one; the
    tokens still count as proposed in the metrics). With ``source``, ``tokens`` are
    placeholders for tokens still on the device (see ``DeviceTokens``: a loop graph's round)."""

    tokens: list[int]
    probs: torch.Tensor | None = None
    num_verify: int | None = None
    source: DeviceTokens | None = None

    @property
    def verified(self) -> list[int]:
        return self.tokens if self.num_verify is None else self.tokens[:self.num_verify]


class Drafter(Plugin, ABC):
    """Proposes draft tokens for requests that are decoding; the core verifies them in one target
    forward with lossless acceptance, so no drafter can change what a request generates."""

    @abstractmethod
    def propose(self, requests: Sequence[Request]) -> dict[str, DraftProposal]:
        """Proposals per request id (requests left out do not speculate this step)."""

    def observe(self, request: Request, num_verified: int, num_accepted: int) -> None:
        """Learn from a verification result."""

    def release(self, request: Request) -> None:
        """The request finished or was preempted: drop any state kept for it."""

    @property
    def max_draft_tokens(self) -> int | None:
        """The most drafts it proposes for one request in a step, when there is such a bound: the
        engine then replays verification steps (up to this many drafts plus the last token per
        request) from device graphs too. None: verification runs eagerly."""
        return None

    def on_verified(self, verified: Sequence[tuple[Request, Sequence[int], int]], best: torch.Tensor,
                    best_host: HostCopy) -> None:
        """On a device that runs queued work asynchronously, right after a step's greedy
        verifications are queued and before the host reads them (what the step reads from the
        device afterwards, other rows' samples and logprobs, waits for that work too): per
        request, (the request, its verified drafts as the step fed them, its first row in
        ``best``); ``best`` holds the
        target's argmax of each verified row (its k drafts and the token after them), still on
        the device, and ``best_host`` its copy to the host. A drafter may queue its next round's
        device work from them (so the device need not wait for the host in between); what it
        proposes next is verified as always. Default: nothing."""

    def enable_graphs(self, graphs: DeviceGraphs, batch_sizes: Sequence[int], max_seq_len: int) -> None:
        """The engine replays its decode steps from device graphs (these batch sizes, sequences up
        to ``max_seq_len`` tokens); a drafter running a model of its own may capture that model's
        one-token steps too, with ``graphs`` (the engine's: one memory pool). Default: nothing."""


# -------------------------------------------------------------------------------------- scheduler
@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """What one step computes: requests with their token counts, in batch order."""

    scheduled: tuple[ScheduledRequest, ...]
    preempted: tuple[Request, ...] = ()
    #: each request's drafts to verify, filled by the core from the tokens a request was scheduled
    #: past its ``num_tokens`` (a scheduler only counts them: ``Request.num_draft_tokens``)
    draft_tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def empty(self) -> bool:
        return not self.scheduled


class Scheduler(Plugin, ABC):
    """Chooses each step's requests and token counts within the budgets, and which running request
    to preempt when blocks run out. It only chooses, through ``ctx.kv`` (``match_prefix``,
    ``allocate``, and ``preempt`` for a victim, which frees its blocks and resets it to be computed
    again); the core does the rest for every scheduler: it appends the step's tokens, runs the stop
    checks, advances ``num_computed_tokens``, sets a request's status, and finishes requests
    (``remove_request``, then their blocks freed). A request with drafts may be given up to
    ``Request.num_draft_tokens`` tokens past its ``num_tokens``: the core verifies that many.

    With ``overlap`` the engine schedules step N+1 while step N runs on the device: a request
    that samples in step N then counts a pending token in ``num_tokens`` until step N's results
    arrive; it is scheduled as usual (its next input comes from the device), and a request whose
    length limit is reached (``Request.length_capped``) should not be scheduled.
    """

    @property
    def overlap(self) -> bool:
        """Let the engine plan the next step while the current one runs."""
        return False

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Queue a new request (status ``WAITING``)."""

    @abstractmethod
    def schedule(self) -> SchedulerOutput:
        """The next step: requests (with blocks allocated for their tokens) and the victims
        preempted to make room (each passed to ``ctx.kv.preempt`` and queued again)."""

    @abstractmethod
    def remove_request(self, request: Request) -> None:
        """Forget a finished or aborted request (the core frees its blocks next)."""

    @property
    @abstractmethod
    def num_running(self) -> int: ...

    @property
    @abstractmethod
    def num_waiting(self) -> int: ...

    def has_unfinished_requests(self) -> bool:
        return bool(self.num_running or self.num_waiting)
