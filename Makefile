# Developer entry points. `make kernels` needs only nvcc and the nvidia-cutlass wheel (no torch, no GPU).
PYTHON ?= python3
NVCC ?= nvcc
BUILD ?= build/kernels
CUTLASS_INC := $(shell $(PYTHON) -c "import importlib.util,os; s=importlib.util.find_spec('cutlass_library'); print(os.path.join(os.path.dirname(s.origin),'source','include') if s else '')")
KERNEL_SRCS := $(shell $(PYTHON) build_config.py sources)
KERNEL_OBJS := $(patsubst hopper/generated/%.cu,$(BUILD)/%.o,$(KERNEL_SRCS))
KERNEL_HDRS := $(wildcard hopper/*/*.h hopper/*/*.hpp)
NVCC_FLAGS := $(shell $(PYTHON) -c "import sys; sys.path.insert(0,'.'); from build_config import nvcc_flags; print(' '.join(nvcc_flags()))")

.PHONY: kernels test plan bench bench-quick clean

kernels: $(KERNEL_OBJS)
	@$(PYTHON) -m build_config report $(BUILD)/*.log

$(BUILD)/%.o: hopper/generated/%.cu $(KERNEL_HDRS) build_config.py
	@test -n "$(CUTLASS_INC)" || { echo "nvidia-cutlass is not installed: pip install --no-deps nvidia-cutlass==4.2.0.0"; exit 1; }
	@mkdir -p $(BUILD)
	@echo "nvcc $<"
	@$(NVCC) $(NVCC_FLAGS) -I hopper -I $(CUTLASS_INC) -c $< -o $@ 2> $(BUILD)/$*.log || { cat $(BUILD)/$*.log; exit 1; }
	@$(PYTHON) build_config.py digest $< > $(BUILD)/$*.digest

test:
	$(PYTHON) -m pytest -q tests

plan:
	flash-attn-dash plan --seqlen 8192 --hdim 128 --causal --png plan.png

# GPU machine: the DASH grid and transformer blocks, side by side with peers (results in benchmarks/results/).
bench:
	PYTHON=$(PYTHON) benchmarks/run_bench.sh benchmarks/results

bench-quick:
	PYTHON=$(PYTHON) benchmarks/run_bench.sh --quick benchmarks/results

clean:
	rm -rf build
