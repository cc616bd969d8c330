# PyTorch's flash-attention kernels, and cuDNN's fused SDPA as PyTorch calls it, on the shapes of
# bench/gpu_bench.cpp's BM_CudaAttention, for a side-by-side reading: qkv (B, T, 3, H, hd) bf16 viewed
# as (B, H, T, hd) q, k, v, causal. Each
# figure is the median over 20 replays of a CUDA graph that holds 10 calls of the aten op (the
# forward, or the backward alone on the forward's saved output and logsumexp), so host overhead is
# out, as in the reel benchmark. FLOP count as there: forward 2 B H T^2 hd, backward 2.5 times that.
import statistics
import torch

aten = torch.ops.aten


def time_graph(fn, calls=10, replays=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def cudnn_passes(q, k, v, dy):
    """cuDNN's SDPA through the public API under sdpa_kernel(CUDNN_ATTENTION): the forward alone, and the
    forward + backward (torch.autograd.grad) in one graph; the backward is their difference."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

    def fwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
        return torch.autograd.grad(out, (qg, kg, vg), dy)

    f = time_graph(fwd)
    return f, time_graph(both) - f


def main():
    print(f"{'B':>3} {'T':>4} {'H':>2} {'hd':>3} {'pass':>8} {'us':>8} {'TFLOP/s':>8}  backend (bf16)")
    for B, T, H, hd in [(16, 128, 4, 64), (16, 256, 8, 64)]:
        qkv = torch.randn(B, T, 3, H, hd, device="cuda", dtype=torch.bfloat16)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        fwd = lambda: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
        out = fwd()
        dy = torch.randn_like(out[0])
        bwd = lambda: aten._scaled_dot_product_flash_attention_backward(
            dy, q, k, v, out[0], out[1], out[2], out[3], out[4], out[5], 0.0, True, out[6], out[7])
        flop = 2.0 * B * H * T * T * hd
        for name, fn, f in [("forward", fwd, flop), ("backward", bwd, 2.5 * flop)]:
            us = time_graph(fn)
            print(f"{B:>3} {T:>4} {H:>2} {hd:>3} {name:>8} {us:8.2f} {f / us / 1e6:8.1f}  flash")
        try:
            for name, us, f in zip(("forward", "backward"), cudnn_passes(q, k, v, dy), (flop, 2.5 * flop)):
                print(f"{B:>3} {T:>4} {H:>2} {hd:>3} {name:>8} {us:8.2f} {f / us / 1e6:8.1f}  cudnn")
        except Exception as e:  # an older PyTorch or cuDNN without the backend: say so, keep the flash rows
            print(f"{B:>3} {T:>4} {H:>2} {hd:>3} cudnn SDPA unavailable: {repr(e)[:200]}")


if __name__ == "__main__":
    main()
