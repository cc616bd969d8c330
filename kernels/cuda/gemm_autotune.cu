// GEMM autotuning on cuBLASLt (see gemm_autotune.h): for max-autotune's matmuls what cudnn.benchmark
// is for convolutions.
//
//   C_i (m, n) = op(A_i) (m, k) @ op(B_i) (k, n) (+ C_i)      cuBLAS's column-major terms, i < batch
//
// Tuning, once per problem — (m, n, k, transposes, leading dims, batch count and strides, operand
// and result dtypes, accumulate, device, and the alignment of the operands' addresses, which
// decides which kernels may run at all) — on its first call outside a graph capture:
//   1. cuBLASLt's heuristics propose up to kCandidates algorithms for a descriptor in the same
//      precision as the untuned path, within our workspace and the call's alignments;
//   2. each candidate, and the untuned cublasGemmStridedBatchedEx (CUBLAS_GEMM_DEFAULT), runs once
//      to warm up and kTimedRuns times between two CUDA events on the current stream (device time,
//      not launch overhead: see time_ms), all on the
//      call's own operands but into a scratch output (with accumulate the candidates then add into
//      the scratch, never into the caller's result, which the real call writes afterwards);
//   3. the fastest is cached; ties keep the untuned path (as does a problem without candidates,
//      untimed).
// Tuning synchronises with the stream (the events); a cached choice never does, so captures and
// replays only look it up. Candidates that fail to launch are skipped, not reported.
//
// Precision (the contract of matmul.cu, kept by every candidate): f32 computes in
// CUBLAS_COMPUTE_32F (never the _FAST_TF32 variants: no TF32), f64 in CUBLAS_COMPUTE_64F, f16 and
// bf16 in CUBLAS_COMPUTE_32F with f32 scaling. The cuBLAS handle's
// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION has no cuBLASLt switch; its equivalent is the
// reduction scheme of split-K algorithms: for a 16-bit result only NONE (no split) or COMPUTE_TYPE
// (partial sums kept and reduced in f32) are allowed — INPLACE and OUTPUT_TYPE reduce in the output
// type — asked of the heuristics by CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK and checked again on
// each returned algorithm. f32 and f64 results reduce in their own type whatever the scheme.
//
// Memory: the cuBLASLt workspace is ours, allocated once per thread and device (so that a capture
// never allocates); the timing scratch is a temporary of the caching allocator, freed after tuning.
// Descriptors and choices live in a process-wide map until exit.
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_timing.h"
#include "kernels/cuda/gemm_autotune.h"

namespace reel::cuda {

namespace {

constexpr int kCandidates = 8;                             // heuristic proposals timed per problem
constexpr int kTimedRuns = 5;                              // after one warm-up run

std::atomic<int64_t> tunings{0};
std::atomic<int64_t> split_runs{0};  // GEMMs gemm_split_k has run

// ---- descriptors ----

struct LtTypes {
  cudaDataType data;
  cublasComputeType_t compute;
  cudaDataType scale;
};

// The types of matmul.cu's untuned path (gemm_types there); nullopt for dtypes it does not handle.
std::optional<LtTypes> lt_types(DType dt) {
  switch (dt) {
    case DType::f32: return LtTypes{CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F};  // exact f32: no TF32
    case DType::f64: return LtTypes{CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    case DType::f16: return LtTypes{CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::bf16: return LtTypes{CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    default: return std::nullopt;
  }
}

bool is_16bit(DType dt) { return dt == DType::f16 || dt == DType::bf16; }

// One problem's cuBLASLt descriptors and its chosen algorithm. Read-only once cached.
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;  // C and D share lc
  cublasLtMatmulAlgo_t algo{};
  bool f64_scale = false;

  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {  // statuses ignored: nothing useful can be done about a failure here
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// A column-major (rows, cols) matrix with leading dim ld, repeated `batch` times `stride` apart.
cublasLtMatrixLayout_t lt_layout(cudaDataType type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                 int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  REEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    const int32_t count = int32_t(batch);  // gemm_autotuned only tunes batches that fit
    cublasStatus_t st = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
    if (st != CUBLAS_STATUS_SUCCESS) cublasLtMatrixLayoutDestroy(l);
    REEL_CUBLAS_CHECK(st);
  }
  return l;
}

// The descriptors of problem p (the stored shapes: op(A) = A^T stores A as (k, m), and so on).
std::unique_ptr<LtPlan> lt_descriptors(const GemmProblem& p, const LtTypes& in, const LtTypes& out) {
  auto plan = std::make_unique<LtPlan>();
  plan->f64_scale = in.scale == CUDA_R_64F;
  REEL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, in.compute, in.scale));
  const cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  REEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  REEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  plan->la = lt_layout(in.data, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.lda, p.batch, p.stride_a);
  plan->lb = lt_layout(in.data, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.ldb, p.batch, p.stride_b);
  plan->lc = lt_layout(out.data, p.m, p.n, p.ldc, p.batch, p.stride_c);
  return plan;
}

// ---- candidates ----

// The largest power of two (at most 256, cuBLASLt's default requirement) dividing the address of
// every matrix of a batch, in bytes.
uint32_t alignment(const void* ptr, int64_t stride, int64_t batch, size_t esize) {
  uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(ptr)) | 256;
  if (batch > 1) bits |= uint64_t(stride) * esize;
  return uint32_t(bits & (~bits + 1));
}

struct Alignments {
  uint32_t a, b, c;
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { REEL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(p); }  // status ignored, as in ~LtPlan
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
};

void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, uint32_t v) {
  REEL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof v));
}

// Whether a split-K algorithm reduces its partial sums in the compute type (or does not split).
bool reduces_in_compute_type(const cublasLtMatmulAlgo_t& algo) {
  uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
  size_t written = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                                  &scheme, sizeof scheme, &written);
  return st == CUBLAS_STATUS_SUCCESS &&
         (scheme == CUBLASLT_REDUCTION_SCHEME_NONE || scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
}

// One candidate algorithm. (Wrapped: a std::vector of cuBLASLt's anonymous struct itself crashes
// nvcc 13.0's front end.)
struct Candidate {
  cublasLtMatmulAlgo_t algo;
};

// cuBLASLt's heuristic candidates for the plan's problem that fit our workspace, the alignments
// and (for a 16-bit result) the reduction-precision rule. No device work.
std::vector<Candidate> lt_candidates(const LtPlan& plan, Device device, const Alignments& al, bool out16) {
  Preference owner;
  const cublasLtMatmulPreference_t pref = owner.p;
  uint64_t ws = kBlasGemmWorkspaceBytes;
  REEL_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  if (out16)
    set_pref(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
             CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al.a);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al.b);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al.c);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al.c);
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int n = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(device), plan.desc, plan.la, plan.lb,
                                                           plan.lc, plan.lc, pref, kCandidates, results, &n);
  std::vector<Candidate> algos;
  // A failure here (NOT_SUPPORTED: no algorithm for this problem) only means no candidates: the
  // untuned path, which handles every problem matmul.cu forms, stays the choice.
  if (st != CUBLAS_STATUS_SUCCESS) return algos;
  for (int i = 0; i < n; ++i) {
    const cublasLtMatmulHeuristicResult_t& r = results[i];
    if (r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > kBlasGemmWorkspaceBytes) continue;
    if (out16 && !reduces_in_compute_type(r.algo)) continue;
    algos.push_back({r.algo});
  }
  return algos;
}

// ---- running and timing ----

// One cublasLtMatmul of the plan with `algo` into c (C and D both c); the status is the caller's.
cublasStatus_t lt_matmul(const LtPlan& plan, const cublasLtMatmulAlgo_t& algo, bool accumulate, Device device,
                         const void* a, const void* b, void* c) {
  static const float f[2] = {0.0f, 1.0f};
  static const double d[2] = {0.0, 1.0};
  const void* alpha = plan.f64_scale ? static_cast<const void*>(&d[1]) : static_cast<const void*>(&f[1]);
  const void* beta = plan.f64_scale ? static_cast<const void*>(&d[accumulate]) : static_cast<const void*>(&f[accumulate]);
  return cublasLtMatmul(cublaslt_handle(device), plan.desc, alpha, a, plan.la, b, plan.lb, beta, c, plan.lc, c, plan.lc,
                        &algo, blas_workspace(device), kBlasGemmWorkspaceBytes, stream_of(device));
}

// Mean device time (ms) of run() over kTimedRuns after one warm-up (device_timing.h).
std::optional<float> time_ms(Device device, const std::function<bool()>& run) {
  return mean_device_ms(device, kTimedRuns, run);
}

// Elements from C's first element to past its last, over the batch.
int64_t output_extent(const GemmProblem& p) {
  return (p.batch - 1) * p.stride_c + (p.n - 1) * p.ldc + p.m;
}

// Times the untuned path and every candidate on (a, b) into a scratch output; returns the plan
// with the fastest candidate, or null when the untuned path is at least as fast.
// `al` holds the alignments of the call's operands; the candidates must also run on the scratch.
std::unique_ptr<LtPlan> tune(const GemmProblem& p, const void* a, const void* b, Alignments al,
                             const std::function<void(void*)>& run_default) {
  std::unique_ptr<LtPlan> plan = lt_descriptors(p, *lt_types(p.in), *lt_types(p.out));
  const size_t es_out = dtype_size(p.out);
  Tensor scratch = workspace(size_t(output_extent(p)) * es_out, p.device);
  void* c = scratch.data_ptr();
  al.c = std::min(al.c, alignment(c, p.stride_c, p.batch, es_out));
  const std::vector<Candidate> algos = lt_candidates(*plan, p.device, al, is_16bit(p.out));
  if (algos.empty()) return nullptr;  // nothing to compare the untuned path with
  blas_workspace(p.device);  // allocated now, eagerly, for the calls that replay the choice

  std::optional<float> best = time_ms(p.device, [&] { run_default(c); return true; });
  int best_i = -1;
  for (size_t i = 0; i < algos.size(); ++i) {
    std::optional<float> ms = time_ms(p.device, [&] {
      return lt_matmul(*plan, algos[i].algo, p.accumulate, p.device, a, b, c) == CUBLAS_STATUS_SUCCESS;
    });
    if (ms && (!best || *ms < *best)) {
      best = ms;
      best_i = int(i);
    }
  }
  if (best_i < 0) return nullptr;
  plan->algo = algos[size_t(best_i)].algo;
  return plan;
}

// ---- the cache ----

using Key = std::array<int64_t, 19>;

// The alignments of a call's operands over its batch. They are part of the problem: an algorithm
// chosen for aligned operands may not run on less aligned ones (a host-looped batch, a view at an
// offset).
Alignments alignments_of(const GemmProblem& p, const void* a, const void* b, const void* c) {
  const size_t es_in = dtype_size(p.in), es_out = dtype_size(p.out);
  return {alignment(a, p.stride_a, p.batch, es_in), alignment(b, p.stride_b, p.batch, es_in),
          alignment(c, p.stride_c, p.batch, es_out)};
}

Key key_of(const GemmProblem& p, const Alignments& al) {
  return {p.m, p.n, p.k, p.trans_a, p.trans_b, p.lda, p.ldb, p.ldc, p.stride_a, p.stride_b, p.stride_c,
          p.batch, int64_t(p.in), int64_t(p.out), p.accumulate, p.device.index, al.a, al.b, al.c};
}

}  // namespace

void gemm_autotuned(const GemmProblem& p, const void* a, const void* b, void* c,
                    const std::function<void(void* dst)>& run_default) {
  if (!lt_types(p.in) || !lt_types(p.out) || p.batch > int64_t(INT32_MAX)) return run_default(c);
  const Alignments al = alignments_of(p, a, b, c);
  const Key key = key_of(p, al);
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<LtPlan>> choices;  // null: the untuned path won
  const LtPlan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = choices.find(key);
    if (it == choices.end()) {
      if (capturing(p.device)) return run_default(c);  // no timing inside a capture; tune later
      it = choices.emplace(key, tune(p, a, b, al, run_default)).first;  // a throw caches nothing
      tunings.fetch_add(1);
    }
    plan = it->second.get();
  }
  if (!plan) return run_default(c);
  REEL_CUBLAS_CHECK(lt_matmul(*plan, plan->algo, p.accumulate, p.device, a, b, c));
}

int64_t gemm_tunings() { return tunings.load(); }

// ---- split-K for weight gradients ----

namespace {

// The split count for a problem whose unsplit algorithm fills `waves` of the GPU: the most splits
// (powers of two up to kMaxSplits) that still fit one wave, each at least kMinSplitDepth deep; 1 when
// even two splits would not fit or be too shallow.
constexpr int kMaxSplits = 16;
constexpr int64_t kMinSplitDepth = 256;

int splits_for(float waves, int64_t k) {
  int s = 1;
  while (2 * s <= kMaxSplits && waves * float(2 * s) <= 1.0f && k / (2 * s) >= kMinSplitDepth) s *= 2;
  return s;
}

// The split plan of p: cuBLASLt's first heuristic algorithm with splits_for(its waves) splits reduced
// in place; null when p is not a candidate or no split applies. No device work.
std::unique_ptr<LtPlan> split_plan(const GemmProblem& p, const Alignments& al) {
  std::unique_ptr<LtPlan> plan = lt_descriptors(p, *lt_types(p.in), *lt_types(p.out));
  const std::vector<Candidate> algos = lt_candidates(*plan, p.device, al, false);
  if (algos.empty()) return nullptr;
  cublasLtMatmulAlgo_t algo = algos.front().algo;
  cublasLtMatmulHeuristicResult_t check{};
  auto valid = [&] {
    return cublasLtMatmulAlgoCheck(cublaslt_handle(p.device), plan->desc, plan->la, plan->lb, plan->lc, plan->lc, &algo,
                                   &check) == CUBLAS_STATUS_SUCCESS &&
           check.workspaceSize <= kBlasGemmWorkspaceBytes;
  };
  if (!valid()) return nullptr;
  const int splits = splits_for(check.wavesCount, p.k);
  if (splits < 2) return nullptr;
  const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_INPLACE;
  if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) !=
          CUBLAS_STATUS_SUCCESS ||
      !valid())
    return nullptr;
  plan->algo = algo;
  return plan;
}

}  // namespace

bool gemm_split_k(const GemmProblem& p, const void* a, const void* b, void* c) {
  if (p.batch != 1 || !is_16bit(p.in) || p.out != DType::f32) return false;
  const Alignments al = alignments_of(p, a, b, c);
  const Key key = key_of(p, al);
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<LtPlan>> plans;  // null: no split for this problem
  const LtPlan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, split_plan(p, al)).first;
    plan = it->second.get();
  }
  if (!plan) return false;
  REEL_CUBLAS_CHECK(lt_matmul(*plan, plan->algo, p.accumulate, p.device, a, b, c));
  split_runs.fetch_add(1);
  return true;
}

int64_t gemm_split_k_runs() { return split_runs.load(); }

}  // namespace reel::cuda
