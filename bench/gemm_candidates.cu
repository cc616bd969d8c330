// cuBLASLt's candidate algorithms timed at the GEMM shapes of gpt-tiny's and gpt-small's training
// step (MODELS.md: 16 sequences a micro-batch; gpt-tiny T 128 d 256, gpt-small T 256 d 512, vocab 256),
// each as the compiled bf16 step runs it:
//
//   fwd  y (R, D) = x (R, C) W^T + b       bf16 out, cuBLASLt's BIAS epilogue, or GELU_AUX_BIAS
//                                           (fc: y = gelu(pre), pre kept for the backward)
//   dx   dx (R, C) = dy (R, D) W            bf16 out (matmul.cu: cublasGemmEx, CUBLAS_GEMM_DEFAULT)
//   dW   dW (D, C) (+)= dy^T x              f32 out, beta 1: the gradient accumulated over micro-batches
//
// for each Linear C -> D of a block (qkv d -> 3d, proj d -> d, fc d -> 4d, fc2 4d -> d) and the head
// (d -> 256), R = 16 T rows. In cuBLAS's column-major terms (reel is row-major: see matmul.cu)
// fwd is m = D, n = R, k = C with op(A) = T; dx is m = C, n = R, k = D, no transposes; dW is
// m = C, n = D, k = R with op(B) = T.
//
// Each candidate (the heuristic's first is what gemm_epilogue.cu runs today; dx and dW also run the
// untuned cublasGemmEx path matmul.cu takes), and the heuristic's first four with split-K forced
// (2 to 16 splits; the partial sums reduced in place in an f32 result, whose counters in the
// workspace fix the order, or in f32 in the workspace: the reductions reel's contract allows, see
// kernels/cuda/gemm_autotune.cu), is captured 20 times back to back in one CUDA graph, as
// the step's graph replays its GEMMs; a replay is timed with events, and the median of 15 replays / 20
// is the figure. The operands are buffers written once with small values.
//
// Build: make build/gemm_candidates (nvcc -O2 -arch=sm_90 ... -lcublasLt -lcublas)
// Run:   build/gemm_candidates [max candidates, default 16]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)
#define CHECK_BLAS(x)                                                                \
  do {                                                                               \
    cublasStatus_t s_ = (x);                                                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, int(s_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

namespace {

constexpr size_t kWorkspace = size_t(32) << 20;  // kernels/cuda/cuda_common.cuh's kBlasWorkspaceBytes
constexpr int kLaunchesPerGraph = 20, kReplays = 15;

enum class Kind { FwdPlain, Fwd, FwdGelu, Dx, DwFirst, DwAdd };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::FwdPlain: return "fwd";
    case Kind::Fwd: return "fwd+bias";
    case Kind::FwdGelu: return "fwd+bias+gelu_aux";
    case Kind::Dx: return "dx";
    case Kind::DwFirst: return "dW (beta 0)";
    case Kind::DwAdd: return "dW (beta 1)";
  }
  return "?";
}

struct Problem {
  std::string model, linear;
  Kind kind;
  int64_t R, C, D;
  int calls;  // per optimizer step: micro-batches (x layers), the first micro-batch's dW alone
  bool fwd() const { return kind == Kind::FwdPlain || kind == Kind::Fwd || kind == Kind::FwdGelu; }
  bool epilogue() const { return kind == Kind::Fwd || kind == Kind::FwdGelu; }
  int64_t m() const { return fwd() ? D : C; }
  int64_t n() const { return kind == Kind::DwFirst || kind == Kind::DwAdd ? D : R; }
  int64_t k() const { return fwd() ? C : kind == Kind::Dx ? D : R; }
  bool f32_out() const { return kind == Kind::DwFirst || kind == Kind::DwAdd; }
  double gflop() const { return 2.0 * double(R) * double(C) * double(D) * 1e-9; }
};

struct Buffers {
  void *a = nullptr, *b = nullptr, *c = nullptr, *aux = nullptr, *bias = nullptr, *ws = nullptr;
};

__global__ void fill_bf16(__nv_bfloat16* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(float(int(i % 17) - 8) * 0.01f);
}

template <typename Launch>
float time_graph_us(cudaStream_t s, Launch&& launch) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kLaunchesPerGraph; ++i) launch();
  CHECK_CUDA(cudaStreamEndCapture(s, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaGraphLaunch(exec, s));
  std::vector<float> us;
  for (int i = 0; i < kReplays; ++i) {
    CHECK_CUDA(cudaEventRecord(e0, s));
    CHECK_CUDA(cudaGraphLaunch(exec, s));
    CHECK_CUDA(cudaEventRecord(e1, s));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(ms * 1000.0f / kLaunchesPerGraph);
  }
  std::sort(us.begin(), us.end());
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  return us[us.size() / 2];
}

struct Lt {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
};

Lt describe(const Problem& p, const Buffers& buf) {
  Lt lt;
  CHECK_BLAS(cublasLtMatmulDescCreate(&lt.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const bool fwd = p.fwd(), dw = p.f32_out();
  const cublasOperation_t ta = fwd ? CUBLAS_OP_T : CUBLAS_OP_N, tb = dw ? CUBLAS_OP_T : CUBLAS_OP_N;
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const int64_t m = p.m(), n = p.n(), k = p.k();
  // A stored (k, m) when transposed, else (m, k); B (n, k) when transposed, else (k, n); leading dims
  // are the stored rows (dense operands, as the step's are).
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&lt.la, CUDA_R_16BF, ta == CUBLAS_OP_T ? k : m, ta == CUBLAS_OP_T ? m : k,
                                        ta == CUBLAS_OP_T ? k : m));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&lt.lb, CUDA_R_16BF, tb == CUBLAS_OP_T ? n : k, tb == CUBLAS_OP_T ? k : n,
                                        tb == CUBLAS_OP_T ? n : k));
  const cudaDataType out = dw ? CUDA_R_32F : CUDA_R_16BF;
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&lt.lc, out, m, n, m));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&lt.ld, out, m, n, m));
  if (p.epilogue()) {
    const cublasLtEpilogue_t epi = p.kind == Kind::Fwd ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    const cudaDataType bt = CUDA_R_16BF;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &buf.bias, sizeof buf.bias));
    if (p.kind == Kind::FwdGelu) {
      CHECK_BLAS(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &m, sizeof m));
      CHECK_BLAS(
          cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &buf.aux, sizeof buf.aux));
    }
  }
  return lt;
}

void release(Lt& lt) {
  cublasLtMatrixLayoutDestroy(lt.la);
  cublasLtMatrixLayoutDestroy(lt.lb);
  cublasLtMatrixLayoutDestroy(lt.lc);
  cublasLtMatrixLayoutDestroy(lt.ld);
  cublasLtMatmulDescDestroy(lt.desc);
}

// "tile 128x128 stages 6 splitK 1 ..." from an algorithm's configuration.
std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
  int id = 0, tile = 0, splitk = 0, stages = 0, cluster = 0;
  size_t got = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &got);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &got);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &got);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &got);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &got);
  char s[96];
  std::snprintf(s, sizeof s, "id %d tile %d stages %d splitK %d cluster %d", id, tile, stages, splitk, cluster);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const int max_candidates = argc > 1 ? std::atoi(argv[1]) : 16;
  std::vector<Problem> problems;
  struct Gpt {
    const char* name;
    int64_t T, d;
    int layers;
  };
  constexpr int kMicroBatches = 4;
  for (Gpt g : {Gpt{"gpt-tiny", 128, 256, 4}, Gpt{"gpt-small", 256, 512, 8}}) {
    const int64_t R = 16 * g.T, d = g.d;
    struct Linear {
      const char* name;
      int64_t C, D;
      Kind fwd;
    };
    for (Linear l : {Linear{"qkv", d, 3 * d, Kind::Fwd}, Linear{"proj", d, d, Kind::Fwd},
                     Linear{"fc", d, 4 * d, Kind::FwdGelu}, Linear{"fc2", 4 * d, d, Kind::Fwd},
                     Linear{"head", d, 256, Kind::FwdPlain}}) {
      const int layers = std::string(l.name) == "head" ? 1 : g.layers;
      for (Kind k : {l.fwd, Kind::Dx, Kind::DwFirst, Kind::DwAdd}) {
        const int per_layer = k == Kind::DwFirst ? 1 : k == Kind::DwAdd ? kMicroBatches - 1 : kMicroBatches;
        problems.push_back({g.name, l.name, k, R, l.C, l.D, per_layer * layers});
      }
    }
  }

  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasLtHandle_t lt_handle;
  cublasHandle_t handle;
  CHECK_BLAS(cublasLtCreate(&lt_handle));
  CHECK_BLAS(cublasCreate(&handle));
  CHECK_BLAS(cublasSetStream(handle, s));
  Buffers buf;
  const size_t big = size_t(64) << 20;  // bytes; the largest operand is 4096 x 2048 x 4
  for (void** p : {&buf.a, &buf.b, &buf.c, &buf.aux, &buf.bias}) CHECK_CUDA(cudaMalloc(p, big));
  CHECK_CUDA(cudaMalloc(&buf.ws, kWorkspace));
  CHECK_BLAS(cublasSetWorkspace(handle, buf.ws, kWorkspace));
  for (void* p : {buf.a, buf.b, buf.bias}) fill_bf16<<<264, 256, 0, s>>>(static_cast<__nv_bfloat16*>(p), big / 2);
  CHECK_CUDA(cudaMemsetAsync(buf.c, 0, big, s));
  CHECK_CUDA(cudaStreamSynchronize(s));

  std::printf("| model | linear | GEMM | m n k | calls/step | GFLOP | heuristic's first us | best us | best/first | "
              "untuned cublasGemmEx us | today's TFLOP/s | candidates | best's config | split-K forced, best us | its config |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::string model;
  double today_step = 0, best_step = 0;
  auto model_total = [&] {
    if (!model.empty())
      std::printf("| %s | all | per step | | | | | | | | | | today %.1f us, best of all %.1f us (%.1f%% less) | | |\n", model.c_str(),
                  today_step, best_step, 100.0 * (1.0 - best_step / today_step));
    today_step = best_step = 0;
  };
  for (const Problem& p : problems) {
    if (p.model != model) model_total(), model = p.model;
    Lt lt = describe(p, buf);
    cublasLtMatmulPreference_t pref;
    CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspace;
    CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(max_candidates, 1)));
    int found = 0;
    CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt_handle, lt.desc, lt.la, lt.lb, lt.lc, lt.ld, pref, max_candidates,
                                              results.data(), &found));
    cublasLtMatmulPreferenceDestroy(pref);
    const float one = 1.0f, beta = p.kind == Kind::DwAdd ? 1.0f : 0.0f;
    float first = -1, best = 1e30f;
    int best_i = -1;
    for (int i = 0; i < found; ++i) {
      const cublasLtMatmulAlgo_t algo = results[size_t(i)].algo;
      const float us = time_graph_us(s, [&] {
        CHECK_BLAS(cublasLtMatmul(lt_handle, lt.desc, &one, buf.a, lt.la, buf.b, lt.lb, &beta, buf.c, lt.lc, buf.c,
                                  lt.ld, &algo, buf.ws, kWorkspace, s));
      });
      if (i == 0) first = us;
      if (us < best) best = us, best_i = i;
    }
    // Split-K forced onto the heuristic's first candidates: the splits and reduction schemes
    // cublasLtMatmulAlgoCheck accepts within the workspace.
    float split_best = 1e30f;
    std::string split_config = "-";
    for (int i = 0; i < std::min(found, 4); ++i)
      for (int splits : {2, 3, 4, 6, 8, 12, 16})
        for (uint32_t scheme : {uint32_t(CUBLASLT_REDUCTION_SCHEME_INPLACE), uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)}) {
          if (scheme == CUBLASLT_REDUCTION_SCHEME_INPLACE && !p.f32_out()) continue;  // would add in 16 bits
          cublasLtMatmulAlgo_t algo = results[size_t(i)].algo;
          if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits) !=
                  CUBLAS_STATUS_SUCCESS ||
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                   sizeof scheme) != CUBLAS_STATUS_SUCCESS)
            continue;
          cublasLtMatmulHeuristicResult_t check{};
          if (cublasLtMatmulAlgoCheck(lt_handle, lt.desc, lt.la, lt.lb, lt.lc, lt.ld, &algo, &check) !=
                  CUBLAS_STATUS_SUCCESS ||
              check.workspaceSize > kWorkspace)
            continue;
          const float us = time_graph_us(s, [&] {
            CHECK_BLAS(cublasLtMatmul(lt_handle, lt.desc, &one, buf.a, lt.la, buf.b, lt.lb, &beta, buf.c, lt.lc, buf.c,
                                      lt.ld, &algo, buf.ws, kWorkspace, s));
          });
          if (us < split_best) {
            split_best = us;
            split_config = "candidate " + std::to_string(i) + ", " + describe_algo(algo) +
                           (scheme == CUBLASLT_REDUCTION_SCHEME_INPLACE ? " in place" : " f32 workspace");
          }
        }
    float untuned = -1;
    if (!p.epilogue()) {
      const bool dw = p.f32_out(), fwd = p.fwd();
      untuned = time_graph_us(s, [&] {
        const int m = int(p.m()), n = int(p.n()), k = int(p.k());
        CHECK_BLAS(cublasGemmEx(handle, fwd ? CUBLAS_OP_T : CUBLAS_OP_N, dw ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &one,
                                buf.a, CUDA_R_16BF, fwd ? k : m, buf.b, CUDA_R_16BF, dw ? n : k, &beta, buf.c,
                                dw ? CUDA_R_32F : CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
    }
    // What the step runs today: the heuristic's first for the epilogues, cublasGemmEx otherwise.
    const float today = untuned > 0 ? untuned : first;
    today_step += p.calls * double(today);
    best_step += p.calls * double(std::min({best, today, split_best}));
    std::printf("| %s | %s | %s | %lld %lld %lld | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %d | %s | %.2f | %s |\n",
                p.model.c_str(), p.linear.c_str(), kind_name(p.kind), (long long)p.m(), (long long)p.n(),
                (long long)p.k(), p.calls, p.gflop(), first, best, best / first, untuned, p.gflop() / today * 1e3,
                found, best_i >= 0 ? describe_algo(results[size_t(best_i)].algo).c_str() : "-",
                split_best < 1e29f ? split_best : -1.0f, split_config.c_str());
    release(lt);
  }
  model_total();
  return 0;
}
