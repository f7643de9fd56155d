"""Placeholder tokens (-(r+1): row r of a device tensor) in steps replayed from graphs: resolved by
the replay itself, or before it when the graph's buffer is too small or the graph resolves none.
Oracle: a stand-in model whose output is its input ids."""
from __future__ import annotations

import itertools

import pytest
import torch

from deepinfer.core.graphs import DecodeGraphs
from deepinfer.plugins.capabilities import DeviceGraphs


class _Replays(DeviceGraphs):
    """Replay re-runs the captured function on the static tensors (as the CPU tests' graphs do)."""

    def capture(self, fn):
        out = fn().clone()
        return (lambda: out.copy_(fn())), out


class _Attention:
    def build_metadata(self, batch):
        return None


def _ids_model(input_ids, positions, kv_caches, meta):
    return input_ids.to(torch.float32)[:, None].clone()


def _graphs(placeholders: bool) -> DecodeGraphs:
    g = DecodeGraphs(_ids_model, _Attention(), [], _Replays(), torch.device("cpu"), 4, [1, 2, 4], 16,
                     placeholders=placeholders)
    g.capture()
    return g


@pytest.mark.parametrize("placeholders", [True, False])
@torch.inference_mode()  # as the engine's steps run
def test_placeholders_become_the_device_tokens_they_stand_for(placeholders):
    g = _graphs(placeholders)
    assert g.prev_tokens.numel() == (4 if placeholders else 0)
    tables = [[0, 1], [2, 3]]
    prev = torch.tensor([11, 12])
    assert g.run(2, [-2, 7], [3, 5], tables, prev)[:, 0].tolist() == [12, 7]
    # more values than the graph's buffer holds: the rows named are gathered into it before the replay
    many = torch.arange(100, 109)
    assert g.run(2, [5, -9], [3, 5], tables, many)[:, 0].tolist() == [5, 108]
    # none: the tokens as given (the buffer's stale values are never read)
    assert g.run(2, [3, 4], [3, 5], tables, None)[:, 0].tolist() == [3, 4]
    assert g.run(1, [-1], [6], tables[:1], torch.tensor([21]))[:, 0].tolist() == [21]
    # a placeholder with no device token behind it is refused before anything runs
    with pytest.raises(ValueError, match="row 2 of the device tokens, but 2 were given"):
        g.run(2, [-3, 4], [3, 5], tables, prev)
    with pytest.raises(ValueError, match="but 0 were given"):
        g.run_padded(2, [[4], [-1]], [3, 5], tables)


@pytest.mark.gpu
@torch.inference_mode()
def test_cuda_graphs_resolve_placeholders_in_the_replay():
    from deepinfer_builtin.devices.cuda import CUDAGraphs

    dev = torch.device("cuda")
    g = DecodeGraphs(_ids_model, _Attention(), [], CUDAGraphs(dev), dev, 4, [1, 2, 4], 16)
    g.capture()
    tables = [[0, 1], [2, 3]]
    assert g.run(2, [-2, 7], [3, 5], tables, torch.tensor([11, 12], device=dev))[:, 0].tolist() == [12, 7]
    assert g.run(2, [3, 4], [3, 5], tables, None)[:, 0].tolist() == [3, 4]
    assert g.run(4, [-1, 5, -4, 6], [1, 2, 3, 4], tables * 2,
                 torch.tensor([31, 32, 33, 34], device=dev))[:, 0].tolist() == [31, 5, 34, 6]


def test_packed_inputs_lay_each_size_out_on_its_own_and_upload_only_its_bytes():
    from deepinfer.core.graphs import PackedInputs

    fields = {"ids": (torch.long, lambda b: (3 * b,)), "lens": (torch.int32, lambda b: (b,)),
              "single": (torch.bool, lambda b: (b,)), "tables": (torch.int32, lambda b: (b, 5))}
    p = PackedInputs(fields, [1, 4], torch.device("cpu"), pin=False)
    for b in (1, 4):
        dev = p.device(b)
        spans = sorted((t.data_ptr() - p.device_buffer.data_ptr(), t.numel() * t.element_size()) for t in dev.values())
        assert all(at % 16 == 0 for at, _ in spans)
        assert all(a + n <= c for (a, n), (c, _) in itertools.pairwise(spans))  # no overlap
        assert {k: (v.dtype, tuple(v.shape)) for k, v in dev.items()} == {
            "ids": (torch.long, (3 * b,)), "lens": (torch.int32, (b,)), "single": (torch.bool, (b,)),
            "tables": (torch.int32, (b, 5))}
    p.device_buffer.fill_(7)
    host = p.host(1, 1)
    host["ids"][:] = [1, 2, 3]
    host["lens"][:] = 9
    host["single"][:] = True
    host["tables"][:] = 4
    p.upload(1, 1)
    dev = p.device(1)
    assert dev["ids"].tolist() == [1, 2, 3] and dev["lens"].tolist() == [9] and dev["single"].tolist() == [True]
    assert dev["tables"].tolist() == [[4] * 5]
    used = p.layouts[1][1]
    assert used < p.device_buffer.numel() and bool((p.device_buffer[used:] == 7).all())  # size 4's bytes untouched


class _Ops:
    """A device's fused ops offering resolve_placeholders (here the torch version, counted)."""

    def __init__(self):
        self.calls = 0

    def resolve_placeholders(self, ids, values, out=None):
        from deepinfer.core.graphs import resolve_placeholders

        self.calls += 1
        return resolve_placeholders(ids, values, out=out)


@torch.inference_mode()
def test_placeholders_go_through_the_devices_fused_op_in_replays_and_eager_steps():
    from deepinfer.core.eager_batch import build_step_batch

    ops = _Ops()
    model = lambda *a: _ids_model(*a)  # a model object that can carry fused ops
    model.fused_ops = ops
    g = DecodeGraphs(model, _Attention(), [], _Replays(), torch.device("cpu"), 4, [1, 2], 16)
    g.capture()
    captured = ops.calls  # the captures ran it too
    assert g.run(2, [-2, 7], [3, 5], [[0, 1], [2, 3]], torch.tensor([11, 12]))[:, 0].tolist() == [12, 7]
    assert ops.calls == captured + 1
    batch = build_step_batch([([5, -1], 2, [0, 1])], 4, torch.device("cpu"), prev_tokens=torch.tensor([9]), ops=ops)
    assert batch.input_ids.tolist() == [5, 9] and ops.calls == captured + 2


class _StagingOps:
    """Fused ops offering stage_inputs (the kernels' torch reference, counted)."""

    stage_max_bytes = 256  # (a step of 2 sequences takes 96 bytes here, one of 64 more than 256)

    def __init__(self):
        self.staged = 0

    def stage_inputs(self, src, turn, dst, n_ids, values):
        from deepinfer_kernels import stage_inputs_ref

        self.staged += 1
        return stage_inputs_ref(src, turn, dst, n_ids, values)


class _BatchAttention:
    def build_metadata(self, batch):
        return batch


def _inputs_model(input_ids, positions, kv_caches, batch):
    """Per row: its token, position and slot, and its sequence's length."""
    return torch.stack([input_ids, positions, batch.slot_mapping, batch.seq_lens.long()], 1).float()


@torch.inference_mode()
def test_small_replays_read_their_inputs_from_host_memory_in_turns():
    model = lambda *a: _inputs_model(*a)
    model.fused_ops = ops = _StagingOps()
    g = DecodeGraphs(model, _BatchAttention(), [], _Replays(), torch.device("cpu"), 4, [1, 2, 64], 16)
    assert g.inputs.staged == {1, 2}  # size 64's inputs take more than the ops stage
    g.capture()
    assert g.inputs.stage_turn.tolist() == [0]  # the captures' staging undone
    uploads = []
    upload = g.inputs.upload
    g.inputs.upload = lambda turn, b: (uploads.append(b), upload(turn, b))
    tables = [[0, 1], [2, 3]]
    prev = g.prev_tokens  # the runner's samples are written straight into the graph's buffer
    prev[:2] = torch.tensor([11, 12])
    seen = []
    for step in range(5):  # turn after turn: each replay reads what its own step filled
        out = g.run(2, [-2, 7 + step], [3 + step, 5], tables, prev)
        seen.append(g.inputs.stage_turn.item())
        assert out.tolist() == [[12, 3 + step, 4 * tables[0][(3 + step) // 4] + (3 + step) % 4, 4 + step],
                                [7 + step, 5, 4 * 3 + 1, 6]]
    assert seen == [1, 0, 1, 0, 1] and uploads == []
    # a step padded to 2: the padding row has length 0 and slot -1
    assert g.run(2, [-1], [6], tables[:1], prev).tolist() == [[11, 6, 4 * 1 + 2, 7]]
    assert g.inputs.device(2)["lens"].tolist() == [7, 0] and g.inputs.device(2)["slots"].tolist() == [6, -1]
    # more values than the graph's buffer holds: the rows named are gathered into it
    many = torch.arange(100, 200)
    assert g.run(2, [-90, -7], [1, 2], tables, many)[:, 0].tolist() == [189, 106]
    # a size too large to stage is uploaded, its placeholders resolved in the replay
    # (the buffer now holds the gathered 106, 189)
    assert g.run(64, [-1] + [5] * 63, [i % 8 for i in range(64)], [[0, 1]] * 64, prev)[:2, 0].tolist() == [106, 5]
    assert uploads == [64] and ops.staged == 2 + 5 + 2  # (the captures: one a staged size)


@pytest.mark.gpu
@torch.inference_mode()
def test_cuda_graph_replays_read_their_inputs_from_pinned_memory_one_step_ahead():
    """Real CUDA graphs and the compiled staging kernel; the host fills the next step while the one
    before is still queued (the engine's overlap: only the step before that is waited for): the
    device sleeps before each replay, so it stays behind the host."""
    from deepinfer_builtin.devices.cuda import CUDAGraphs
    from deepinfer_kernels import FusedOps

    dev = torch.device("cuda")
    model = lambda *a: _inputs_model(*a)
    model.fused_ops = FusedOps()
    g = DecodeGraphs(model, _BatchAttention(), [], CUDAGraphs(dev), dev, 4, [1, 2, 8], 16)
    assert g.inputs.staged == {1, 2, 8} and g.inputs.stage_host.is_pinned()
    g.capture()
    tables = [[0, 1, 5, 6], [2, 3, 7, 8]]
    g.prev_tokens[:2] = torch.tensor([11, 12], device=dev)
    outs, done = [], []
    for step in range(12):
        if step >= 2:
            done[step - 2].synchronize()
        torch.cuda._sleep(2_000_000)  # (cycles: about a millisecond)
        outs.append(g.run(2, [-2, 7 + step], [step, 3], tables, g.prev_tokens).clone())
        done.append(torch.cuda.Event())
        done[-1].record()
    for step, out in enumerate(outs):
        assert out.tolist() == [[12, step, 4 * tables[0][step // 4] + step % 4, step + 1],
                                [7 + step, 3, 4 * 2 + 3, 4]], step
