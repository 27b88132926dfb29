"""GPU tests of torch.compile (hmla/_torch_library.py): a dense and a sparse decode step compile with
fullgraph=True and no graph break, plan once per metadata object, give the eager results, and the
compiled step captured in a CUDA graph replays correctly with new inputs copied in. opcheck tests the
registered ops (schema, fake implementations against the real ones, AOT dispatch)."""

import pytest

import hmla
from gpu_ref import make_case
from test_gpu_sparse import make_cache, make_indices

pytestmark = pytest.mark.gpu

B, S_Q, H_Q = 4, 2, 64
CAPACITY = 4096


def dense_step(q, k_cache, block_table, cache_seqlens, q_next_layer):
    """One decoding step of two layers sharing FlashMLA's per-step metadata object."""
    meta, _ = hmla.get_mla_metadata()
    out, lse = hmla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, meta, causal=True)
    out2, lse2 = hmla.flash_mla_with_kvcache(q_next_layer, k_cache, block_table, cache_seqlens, 512, meta,
                                             softmax_scale=0.05, causal=True)
    return out, lse, out2, lse2


def sparse_step(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices, extra_topk_length):
    meta, _ = hmla.get_mla_metadata()
    kw = dict(is_fp8_kvcache=True, indices=indices, attn_sink=attn_sink, extra_k_cache=extra_k_cache,
              extra_indices_in_kvcache=extra_indices, topk_length=topk_length, extra_topk_length=extra_topk_length)
    out, lse = hmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, None, **kw)
    # the second layer's query is made in the graph: an intermediate tensor as the op's input
    out2, lse2 = hmla.flash_mla_with_kvcache(q * 0.5, k_cache, None, None, 512, meta, None, softmax_scale=0.07, **kw)
    return out, lse, out2, lse2


def assert_same(torch, got, want):
    """Outputs of a compiled call against the eager call's: same shapes, dtypes and strides, values equal
    within 1e-6 (the same kernels on the same schedule; +inf lse where a query has no key)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
        torch.testing.assert_close(g.float(), w.float(), rtol=0, atol=1e-6)


def hmla_ops_in(torch, fn, *args):
    """(graph count, graph breaks, names of the hmla ops in the captured graphs) of Dynamo's trace of fn."""
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*args)
    names = [str(node.target) for graph in explanation.graphs for node in graph.graph.nodes
             if node.op == "call_function" and "hmla." in str(node.target)]
    return explanation.graph_count, explanation.graph_break_count, names


def dense_inputs(torch, lengths=(10, 200, 3000, 0)):
    q, k, bt, sl = make_case(torch, B, S_Q, H_Q, 1, list(lengths), capacity=CAPACITY, poison=False)
    return q, k, bt, sl, torch.randn_like(q)


def sparse_inputs(torch, d_qk, with_options, seed=3):
    gen = torch.Generator(device="cuda").manual_seed(seed + d_qk)
    b, s_q, h_q, topk, extra_topk = 4, 2, H_Q, 100, 64
    k_cache, _ = make_cache(torch, 12, 64, d_qk, gen)
    q = torch.randn(b, s_q, h_q, d_qk, generator=gen, device="cuda").to(torch.bfloat16)
    indices = make_indices(torch, b, s_q, topk, 12 * 64, gen)
    if not with_options:
        return q, k_cache, indices, None, None, None, None, None
    extra_k, _ = make_cache(torch, 40, 2, d_qk, gen)  # another page size
    extra_indices = make_indices(torch, b, s_q, extra_topk, 80, gen)
    topk_length = torch.tensor([topk, 0, 37, 1], dtype=torch.int32, device="cuda")
    extra_topk_length = torch.tensor([5, 0, extra_topk, 64], dtype=torch.int32, device="cuda")
    sink = torch.randn(h_q, generator=gen, device="cuda")
    return q, k_cache, indices, topk_length, sink, extra_k, extra_indices, extra_topk_length


def test_dense_step_compiles_without_graph_break(torch_cuda):
    torch = torch_cuda
    args = dense_inputs(torch)
    graphs, breaks, ops = hmla_ops_in(torch, dense_step, *args)
    assert (graphs, breaks) == (1, 0)
    # one plan for the step, one run per layer
    assert sum("dense_decode_plan" in n for n in ops) == 1 and sum("dense_decode_run" in n for n in ops) == 2, ops
    compiled = torch.compile(dense_step, fullgraph=True)
    assert_same(torch, compiled(*args), dense_step(*args))
    # a second step with other lengths: the same graph plans again
    args[3].copy_(torch.tensor([4096, 1, 64, 999], dtype=torch.int32))
    assert_same(torch, compiled(*args), dense_step(*args))


def test_compiled_dense_call_with_a_metadata_object_from_outside(torch_cuda):
    """The metadata object passed in: the first compiled call allocates its workspace and plans, later
    ones only run (FlashMLA's reuse rule); an eager call with it afterwards plans into that workspace."""
    torch = torch_cuda
    q, k, bt, sl, q2 = dense_inputs(torch)

    def layer(q, meta):
        return hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)

    def eager(q):
        return layer(q, hmla.get_mla_metadata()[0])

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    meta, _ = hmla.get_mla_metadata()
    assert_same(torch, compiled(q, meta), eager(q))
    ws = meta.workspace
    assert isinstance(ws, torch.Tensor) and ws.dtype == torch.uint8 and meta._graph_plan is not None
    assert_same(torch, compiled(q2, meta), eager(q2))
    assert meta.workspace is ws
    assert_same(torch, layer(q2, meta), eager(q2))  # eager, same object
    assert meta.workspace is ws and meta.schedule is not None
    # FlashMLA's reset idiom makes the compiled call plan again, for new lengths
    sl.copy_(torch.tensor([7, 4000, 0, 512], dtype=torch.int32))
    meta.tile_scheduler_metadata = None
    assert_same(torch, compiled(q, meta), eager(q))


def compile_and_capture(torch, step, args):
    """step compiled with fullgraph=True, run twice on a side stream (compilation and first launches
    stay outside the capture), then captured in a CUDA graph: (graph, the captured outputs)."""
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            compiled(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = compiled(*args)
    return graph, captured


def test_compiled_dense_step_in_a_cuda_graph(torch_cuda):
    torch = torch_cuda
    args = dense_inputs(torch)
    q, k, bt, sl, q2 = args
    graph, captured = compile_and_capture(torch, dense_step, args)
    for lengths in ([10, 200, 3000, 0], [4000, 1, 0, 999], [4096, 4095, 1, 2]):
        sl.copy_(torch.tensor(lengths, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        q2.copy_(torch.randn_like(q2))
        graph.replay()
        torch.cuda.synchronize()
        assert_same(torch, captured, dense_step(*args))


@pytest.mark.parametrize("d_qk", [576, 512])
@pytest.mark.parametrize("with_options", [False, True], ids=["indices_only", "sink_lengths_extra_cache"])
def test_sparse_step_compiles_without_graph_break(torch_cuda, d_qk, with_options):
    torch = torch_cuda
    args = sparse_inputs(torch, d_qk, with_options)
    graphs, breaks, ops = hmla_ops_in(torch, sparse_step, *args)
    assert (graphs, breaks) == (1, 0)
    assert sum("sparse_decode_plan" in n for n in ops) == 1 and sum("sparse_decode_run" in n for n in ops) == 2, ops
    compiled = torch.compile(sparse_step, fullgraph=True)
    assert_same(torch, compiled(*args), sparse_step(*args))


def test_compiled_sparse_step_in_a_cuda_graph(torch_cuda):
    torch = torch_cuda
    args = sparse_inputs(torch, 576, True)
    q, k_cache, indices, topk_length, sink, extra_k, extra_indices, extra_topk_length = args
    gen = torch.Generator(device="cuda").manual_seed(21)
    graph, captured = compile_and_capture(torch, sparse_step, args)
    for lengths, extra_lengths in (([100, 0, 37, 1], [5, 0, 64, 64]), ([1, 100, 99, 0], [64, 64, 0, 1])):
        q.copy_(torch.randn(q.shape, generator=gen, device="cuda").to(torch.bfloat16))
        indices.copy_(make_indices(torch, *indices.shape, 12 * 64, gen))
        extra_indices.copy_(make_indices(torch, *extra_indices.shape, 80, gen))
        topk_length.copy_(torch.tensor(lengths, dtype=torch.int32))
        extra_topk_length.copy_(torch.tensor(extra_lengths, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert_same(torch, captured, sparse_step(*args))


def test_opcheck_dense_ops(torch_cuda):
    torch = torch_cuda
    q, k, bt, sl, _ = dense_inputs(torch)
    ws = torch.empty(hmla._C.dense_decode_workspace_bytes(B, S_Q, H_Q, 1, 0, "test"), dtype=torch.uint8,
                     device="cuda")
    torch.library.opcheck(torch.ops.hmla.dense_decode_plan.default, (sl, ws, S_Q, H_Q, 1))
    # A run reads the plan its workspace holds (opcheck runs it on copies of ws): ws is planned first.
    torch.ops.hmla.dense_decode_plan(sl, ws, S_Q, H_Q, 1)
    torch.library.opcheck(torch.ops.hmla.dense_decode_run.default, (q, k, bt, sl, ws, 0.1, True))


@pytest.mark.parametrize("d_qk", [576, 512], ids=["v32", "model1"])
def test_opcheck_sparse_ops(torch_cuda, d_qk):
    torch = torch_cuda
    q, k_cache, indices, topk_length, sink, extra_k, extra_indices, extra_topk_length = sparse_inputs(torch, d_qk, True)
    b, s_q, h_q, _ = q.shape
    ws = torch.empty(hmla._C.sparse_decode_workspace_bytes(b, s_q, h_q, 0, "test"), dtype=torch.uint8, device="cuda")
    torch.library.opcheck(torch.ops.hmla.sparse_decode_plan.default,
                          (ws, topk_length, extra_topk_length, b, s_q, h_q, indices.shape[2], True,
                           extra_indices.shape[2]))
    torch.ops.hmla.sparse_decode_plan(ws, topk_length, extra_topk_length, b, s_q, h_q, indices.shape[2], True,
                                      extra_indices.shape[2])
    # The FP8 caches as bytes (the op reads them as bytes either way): opcheck's schema check does
    # arithmetic on every input, which PyTorch has no float8 kernels for.
    # test_aot_dispatch_dynamic runs the op on contiguous copies of its inputs: a MODEL1 cache's pages
    # are padded to a multiple of 576 bytes past their token data, a padding a contiguous copy drops,
    # so the op rightly rejects the copy (block stride below the layout's page bytes). V3.2 pages
    # have no padding: all four checks run on them.
    checks = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.hmla.sparse_decode_run.default,
                          (q, k_cache.view(torch.uint8), indices, topk_length, sink, extra_k.view(torch.uint8),
                           extra_indices, extra_topk_length, ws, 0.05),
                          test_utils=checks if d_qk == 576 else checks[:3])


def test_schedule_rebuilt_from_a_planned_workspace_equals_the_plans(torch_cuda):
    """The run ops rebuild the host schedule from the workspace (no cache by address): the same as the plan's."""
    torch = torch_cuda
    _, _, _, sl, _ = dense_inputs(torch)
    ws = torch.empty(hmla._C.dense_decode_workspace_bytes(B, S_Q, H_Q, 1, 0, "test"), dtype=torch.uint8,
                     device="cuda")
    from torch.utils.dlpack import to_dlpack
    planned = hmla._C.dense_decode_plan(to_dlpack(sl), S_Q, H_Q, 1, to_dlpack(ws), 0, "test")
    rebuilt = hmla._C.dense_decode_schedule(to_dlpack(ws), B, S_Q, H_Q, 1, "test")
    assert repr(rebuilt) == repr(planned) and repr(planned).startswith(f"hmla.Schedule(batch={B}, s_q={S_Q}"), repr(planned)
    for field in ("batch", "s_q", "h_q", "h_kv", "num_sm_parts", "num_m_blocks", "workspace_ptr", "workspace_bytes",
                  "device", "sparse"):
        assert getattr(rebuilt, field) == getattr(planned, field), field
