# reel — build, test, benchmark.
#   make          library (build/libreel.a) and the `reel` tool (build/reel)
#   make test     checks that includes follow the layer order (tools/check_layers.sh) and that every
#                 CUDA kernel opens with its launch-order wait (tools/check_kernel_prologue.sh), then
#                 builds and runs every GoogleTest suite (build/reel_tests), then the data-parallel suite under
#                 mpirun -np 2 (build/reel_dist_tests)
#   make bench    builds and runs the Google Benchmark suites (build/reel_bench)
#   make run      trains the default example, its step compiled (see README)
# Missing Debian packages are installed on first build (tools/install_deps.sh).

BUILD    ?= build
CXX      ?= g++
OPT      ?= -O2
CXXFLAGS ?= $(OPT) -march=x86-64-v3 -g0
CXXFLAGS += -std=c++20 -fopenmp -Wall -Wextra -Wno-unused-parameter -I. -isystem /usr/include/eigen3 -MMD -MP
# oneDNN (Debian's libdnnl-dev): the CPU convolutions and GEMMs (kernels/cpu/).
LDLIBS   := -fopenmp -lpthread -lz -ldl -ldnnl
# Sanitizer flags for compiling and linking (make sanitize sets them for its own build folder).
SANITIZE ?=
CXXFLAGS += $(SANITIZE)
LDLIBS   += $(SANITIZE)

# The CUDA backend is built whenever nvcc is found (sm_90: H100/H200); otherwise stubs say "not built".
NVCC      ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
CUDA_HOME ?= $(if $(NVCC),$(abspath $(dir $(NVCC))/..))
CUDA_ARCH ?= sm_90

LIB_DIRS := tensor kernels kernels/schema kernels/cpu kernels/jit autograd autograd/functions autograd/cases \
            distributed nn optim data compile/ir compile/passes compile/codegen compile/runtime parallel
NO_CUDA_SRCS := kernels/cuda_stub.cpp tensor/cuda_none.cpp
CUDA_HOST_SRCS := tensor/cuda_runtime.cpp
LIB_SRCS := $(filter-out $(NO_CUDA_SRCS) $(CUDA_HOST_SRCS),$(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.cpp)))
ifneq ($(NVCC),)
  CXXFLAGS += -DREEL_CUDA -isystem $(CUDA_HOME)/include
  NVCCFLAGS ?= -O2 -arch=$(CUDA_ARCH) -Wno-deprecated-gpu-targets
  NVCCFLAGS += -std=c++20 -I. -isystem /usr/include/eigen3 --expt-relaxed-constexpr -Xcompiler -fopenmp,-Wall
  LIB_SRCS += $(CUDA_HOST_SRCS)
  CU_SRCS  := $(wildcard kernels/cuda/*.cu)
  LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lcublasLt -lcudnn -lnvrtc -Wl,-rpath,$(CUDA_HOME)/lib64
else
  LIB_SRCS += $(NO_CUDA_SRCS)
  CU_SRCS  :=
endif
LIB_OBJS := $(LIB_SRCS:%.cpp=$(BUILD)/%.o) $(CU_SRCS:%.cu=$(BUILD)/%.o)
TOOL_SRCS := $(wildcard tools/*.cpp)
TEST_SRCS := $(wildcard tests/*.cpp tests/op_harness/*.cpp)
DIST_TEST_SRCS := $(wildcard tests/dist/*.cpp)
BENCH_SRCS := $(wildcard bench/*.cpp)

LIB   := $(BUILD)/libreel.a
TOOL  := $(BUILD)/reel
TESTS := $(BUILD)/reel_tests
BENCH := $(BUILD)/reel_bench
DEPS_STAMP := $(BUILD)/.deps

# Data parallel over MPI: libreel never links libmpi (the binaries also run where libmpi.so.40 is not
# on the loader path); the plugin does, with the C flags of Open MPI's mpicc wrapper, and libreel
# dlopen()s it under mpirun (distributed/mpi_communicator.h). Its test suite runs under mpirun -np 2.
MPICC      ?= $(shell command -v mpicc 2>/dev/null)
MPIRUN     ?= $(shell command -v mpirun 2>/dev/null)
MPI_PLUGIN := $(BUILD)/libreel_mpi.so
DIST_TESTS := $(BUILD)/reel_dist_tests
# Open MPI refuses to start as root unless told; CI runs as root.
MPIRUN_FLAGS ?= -np 2 --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root)

.PHONY: all test bench run clean deps gpu-bundle mpi dist-test sanitize check-layers check-kernels
# The MPI parts go through a second make, which looks for mpicc after the first has installed it.
all: $(TOOL)
	@$(MAKE) --no-print-directory mpi
ifneq ($(MPICC),)
mpi: $(MPI_PLUGIN) $(DIST_TESTS)
else
mpi:
	@echo "make: mpicc not found: the MPI plugin and the data-parallel tests are not built"
	@if [ "$${CI:-}" = "true" ]; then echo "make: CI=true: the data-parallel suite must run; install Open MPI (mpicc)"; exit 1; fi
endif

deps: $(DEPS_STAMP)
$(DEPS_STAMP): tools/install_deps.sh
	@mkdir -p $(BUILD)
	bash tools/install_deps.sh
	@touch $@

$(BUILD)/%.o: %.cpp | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

# The AVX-512 packets of kernels/cpu/vector_math.h: this one file is built for AVX-512 and called only
# where the CPU has it (vector_math.cpp checks at run time); everything else stays x86-64-v3. Its
# object must define no weak symbols: an out-of-line template instance (Eigen's) compiled here for
# AVX-512 could be kept by the linker in place of the AVX2 object's copy of the same instance, and run
# on a CPU without AVX-512. The build stops if one appears (DW.ref.* are the unwinder's data
# references, the same bytes in every object, not code).
$(BUILD)/kernels/cpu/vector_math_avx512.o: kernels/cpu/vector_math_avx512.cpp | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -mavx512f -mavx512dq -mavx512bw -mavx512vl -Wno-maybe-uninitialized -c $< -o $@
	@if nm --defined-only $@ | grep ' [WVu] ' | grep -qv ' DW\.ref\.'; then \
	  echo "$@ defines weak symbols, which the linker could share with the AVX2 objects:"; \
	  nm -C --defined-only $@ | grep ' [WVu] '; rm -f $@; exit 1; fi

$(BUILD)/%.o: %.cu | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MD -MP -MF $(@:.o=.d) -c $< -o $@

# cuDNN's fused attention (kernels/cuda/attention_cudnn.cu) is written against the cuDNN frontend, a
# header-only library that tools/fetch_cudnn_frontend.sh fetches (PyPI's nvidia-cudnn-frontend, pinned)
# into the build folder; its flags file is empty when the fetch failed, and the file then builds
# without it (the attention op keeps reel's own kernels). The frontend's headers are heavy: only this
# file includes them.
CUDNN_FE := $(BUILD)/third_party/cudnn_frontend
$(CUDNN_FE)/flags: tools/fetch_cudnn_frontend.sh
	bash tools/fetch_cudnn_frontend.sh $(CUDNN_FE)

$(BUILD)/kernels/cuda/attention_cudnn.o: kernels/cuda/attention_cudnn.cu $(CUDNN_FE)/flags | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $$(cat $(CUDNN_FE)/flags) -diag-suppress 128 -MD -MP -MF $(@:.o=.d) -c $< -o $@

$(LIB): $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(TOOL): $(TOOL_SRCS:%.cpp=$(BUILD)/%.o) $(LIB)
	$(CXX) $^ -o $@ $(LDLIBS)

$(TESTS): $(TEST_SRCS:%.cpp=$(BUILD)/%.o) $(LIB)
	$(CXX) $^ -o $@ -lgtest -lgtest_main $(LDLIBS)

$(MPI_PLUGIN): distributed/mpi/plugin.cpp distributed/mpi_plugin_abi.h | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(OPT) -std=c++20 -Wall -Wextra -fPIC -shared -I. $(shell $(MPICC) --showme:compile 2>/dev/null) $< -o $@ $(shell $(MPICC) --showme:link 2>/dev/null)

# Its own main (tests/dist/main.cpp): only rank 0 prints GoogleTest's progress.
$(DIST_TESTS): $(DIST_TEST_SRCS:%.cpp=$(BUILD)/%.o) $(LIB)
	$(CXX) $^ -o $@ -lgtest $(LDLIBS)

# Google Benchmark is a shared library on Debian; the rpath lets a copy beside the binary be used.
$(BENCH): $(BENCH_SRCS:%.cpp=$(BUILD)/%.o) $(LIB)
	$(CXX) $^ -o $@ -lbenchmark -lbenchmark_main -Wl,-rpath,'$$ORIGIN' $(LDLIBS)

# No folder includes one above it (DESIGN.md's layers; known exceptions in tools/layer_exceptions.txt).
check-layers:
	@bash tools/check_layers.sh

# Every CUDA kernel opens with grid_dependency_wait() and is launched by launch_kernel()
# (kernels/cuda/launch.cuh: programmatic dependent launch).
check-kernels:
	@bash tools/check_kernel_prologue.sh

# The source checks first: they take a second, and a build is not needed to fail them.
test: check-layers check-kernels $(TESTS) $(TOOL)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} REEL_BIN=$(TOOL) $(TESTS) --gtest_brief=1
	@$(MAKE) --no-print-directory dist-test

# Two ranks of one thread each: CI has two cores.
dist-test: mpi
ifneq ($(MPICC),)
	OMP_NUM_THREADS=1 $(MPIRUN) $(MPIRUN_FLAGS) -x OMP_NUM_THREADS $(DIST_TESTS) --gtest_brief=1
endif

# The CPU test suite under AddressSanitizer and UndefinedBehaviorSanitizer, in a build folder of its
# own (no CUDA: the GPU's memory is compute-sanitizer's, on the GPU machine). Any report fails the run.
# -g1 (line tables) comes after CXXFLAGS' -g0, so reports name files and lines. One test asks for more
# memory than exists (the out-of-memory message): ASan's allocator returns null then, as malloc does.
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -g1
sanitize:
	@$(MAKE) --no-print-directory NVCC= BUILD=build-sanitize OPT="-O1" SANITIZE="$(SANITIZE_FLAGS)" \
	  build-sanitize/reel_tests build-sanitize/reel
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=2 \
	  REEL_BIN=build-sanitize/reel build-sanitize/reel_tests --gtest_brief=1

bench: $(BENCH)
	$(BENCH) --benchmark_counters_tabular=true

# The main job: the Fashion-MNIST CNN with micro-batches and gradient accumulation (GPU if visible).
# Trains the default model; its log and loss curve land in build/run/ (train.jsonl, train.png).
run: $(TOOL)
	@mkdir -p $(BUILD)/run
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$$(nproc)} $(TOOL) train --compile reduce-overhead --log $(BUILD)/run/train.jsonl

# cuBLASLt's candidate algorithms (and split-K variants) timed at the GPT GEMM shapes: a standalone
# CUDA program (bench/gemm_candidates.cu), built only where nvcc is.
GEMM_CANDIDATES := $(if $(NVCC),$(BUILD)/gemm_candidates)
$(BUILD)/gemm_candidates: bench/gemm_candidates.cu
	@mkdir -p $(dir $@)
	$(NVCC) -O2 -arch=$(CUDA_ARCH) -std=c++17 $< -o $@ -lcublasLt -lcublas

# The binaries (and Google Benchmark's shared library) in one folder that travels to a GPU machine,
# where tools/gpu_check.sh runs them.
gpu-bundle: $(TESTS) $(TOOL) $(BENCH) $(GEMM_CANDIDATES)
	@mkdir -p .gpu
	cp $(TESTS) $(TOOL) $(BENCH) $(GEMM_CANDIDATES) .gpu/
	cp $(MPI_PLUGIN) $(DIST_TESTS) .gpu/ 2>/dev/null || true
	cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian .gpu/ 2>/dev/null || true
	cp -L /usr/lib/x86_64-linux-gnu/libdnnl.so.2 .gpu/ 2>/dev/null || true

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
