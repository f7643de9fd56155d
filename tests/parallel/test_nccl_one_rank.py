"""The NCCL path on one GPU, as far as a world of one allows: the collectives the tensor- and
expert-parallel layers call, on CUDA tensors through an NCCL group of one rank, and a MoE layer
whose tokens travel through ``all_to_all_single`` giving the plain layer's output (the oracle).
Several GPUs are a separate issue (those machines are not lent now)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nccl_world():
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_tensor_parallel_collectives_on_nccl(nccl_world):
    from deepinfer.parallel.state import TensorParallel

    tp = TensorParallel(0, 1, nccl_world)
    x = torch.randn(3, 5, device="cuda")
    assert torch.equal(tp.all_reduce(x.clone()), x)
    assert torch.equal(tp.gather_to_driver(x), x)


def test_expert_exchange_on_nccl(nccl_world):
    from deepinfer.parallel.state import ExpertParallel

    ep = ExpertParallel(0, 1, nccl_world)
    rows = torch.randn(7, 16, device="cuda", dtype=torch.bfloat16)
    assert ep.counts(torch.tensor([7], device="cuda")) == [7]
    assert torch.equal(ep.exchange(rows, [7], [7]), rows)
    assert ep.exchange(rows[:0], [0], [0]).shape == (0, 16)  # (a rank with no tokens still joins)


@pytest.mark.parametrize("tokens", [0, 1, 37])
def test_an_expert_parallel_moe_layer_over_nccl_gives_the_plain_layers_output(nccl_world, tokens):
    from deepinfer.models.expert_parallel_moe import ExpertParallelMoE
    from deepinfer.models.moe import MoE, Routing
    from deepinfer.parallel.state import ExpertParallel

    torch.manual_seed(0)
    routing = Routing(top_k=2, scoring="sigmoid", n_group=2, topk_group=1, group_limited=True, norm_topk_prob=True)
    plain = MoE(64, 8, 32, 1, routing).cuda()
    with torch.no_grad():
        for p in plain.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    plain.reset_load()
    ep = ExpertParallelMoE(64, 8, 32, 1, routing, ExpertParallel(0, 1, nccl_world)).cuda()
    ep.load_state_dict(plain.state_dict())
    ep.reset_load()
    ep.reset_placement()
    x = torch.randn(tokens, 64, device="cuda")
    torch.testing.assert_close(ep(x), plain(x))
    assert torch.equal(ep.expert_load, plain.expert_load)
