# Vendor plugins (issue 14): Mooncake, NIXL, MORI-IO, loaded at run time.
#   make vendor-smoke  builds every plugin binary (make plugins) and checks
#                      that each vendor plugin, run without its library,
#                      refuses with one classified line naming its variable
#                      (a few seconds). Their fake-library tests, the
#                      dishonest variants included, run in `make unit`; the
#                      certifications over the fakes in `make unit-long`.
#   make vendor-real   the tests against real libraries; each runs only when
#                      its variable (KVFENCE_MOONCAKE_LIB, KVFENCE_NIXL_LIB,
#                      KVFENCE_MORI_SHIM) is set, and says it was skipped
#                      otherwise. Never part of CI: CI has no vendor library.
VENDOR_PLUGINS := mooncake:KVFENCE_MOONCAKE_LIB nixl:KVFENCE_NIXL_LIB mori:KVFENCE_MORI_SHIM

#   make mori-shim     builds kvfence's MORI shim (plugins/mori/shim) into
#                      $(BIN)/libkvfence_mori_shim.so, only where MORI-IO's
#                      headers and library are (MORI_HOME); never in CI.
#                      MORI's headers include HIP's (hip/hip_runtime_api.h)
#                      and need C++20 (checked against MORI 624002c8); HIP
#                      headers are taken from $(ROCM_PATH)/include, and
#                      MORI_CXXFLAGS adds any other flags.
MORI_HOME ?=
ROCM_PATH ?= /opt/rocm
MORI_CXXFLAGS ?=

.PHONY: vendor-smoke vendor-real mori-shim

mori-shim:
	@[ -n "$(MORI_HOME)" ] && [ -f "$(MORI_HOME)/include/mori/io/engine.hpp" ] || \
	  { echo "mori-shim: set MORI_HOME to a MORI-IO install (include/mori/io/engine.hpp, lib/libmori_io.so)" >&2; exit 1; }
	mkdir -p $(BIN)
	$(CXX) -std=c++20 -shared -fPIC -O2 -D__HIP_PLATFORM_AMD__ -Iplugins/mori/shim -I$(MORI_HOME)/include -I$(ROCM_PATH)/include $(MORI_CXXFLAGS) plugins/mori/shim/kvfence_mori_shim.cpp \
	  -L$(MORI_HOME)/lib -Wl,-rpath,$(MORI_HOME)/lib -lmori_io -o $(BIN)/libkvfence_mori_shim.so

vendor-smoke: plugins
	@for pv in $(VENDOR_PLUGINS); do \
	  p=$${pv%%:*}; v=$${pv##*:}; \
	  out=$$(env -u $$v LD_LIBRARY_PATH=/nonexistent $(BIN)/kvfence-plugin-$$p 2>&1 >/dev/null) && { echo "$$p started without its library" >&2; exit 1; }; \
	  [ "$$(printf '%s\n' "$$out" | wc -l)" = 1 ] && printf '%s' "$$out" | grep -q "^failed-precondition: .*$$v" || \
	    { echo "$$p: want one failed-precondition line naming $$v, got: $$out" >&2; exit 1; }; \
	  echo "vendor-smoke $$p: $$out"; \
	done

vendor-real:
	$(GO) test -count=1 -v -run 'TestRealLibrary|TestRealShim' ./plugins/mooncake/ ./plugins/nixl/ ./plugins/mori/ 2>&1 | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|skip|SKIP'

TEST_STEPS += vendor-smoke
