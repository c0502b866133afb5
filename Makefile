# A thin front over the set-up script and Meson (build directory: build/).
.PHONY: all setup build test demo bench clean fuzz test-asan test-container

all: build

setup:
	@bash scripts/setup.sh

# Re-configures a missing or half-made build directory; ninja re-runs Meson
# itself when a meson.build changed.
build: setup
	@if [ ! -f build/build.ninja ]; then rm -rf build && meson setup build --buildtype=release; fi
	@meson compile -C build

# The container suite builds an image (a cold build takes some 25 minutes on
# 2 cores): `make test-container`, not part of `make test`.
test: build
	@meson test -C build --print-errorlogs --num-processes 2 --no-suite container

# deploy/container's image built with Podman and `make demo`'s run inside
# (tests/integration/container_test.py); skipped, saying why, where no
# container runtime works. COHORT_CONTAINER_CACHE keeps the image between runs.
test-container: build
	@bash scripts/setup.sh container
	@meson test -C build --print-errorlogs --suite container

demo: build
	@bash scripts/demo.sh

bench: build
	@bash bench/run.sh

# The whole suite (unit, integration and fuzz-corpus replays) built with
# AddressSanitizer and UndefinedBehaviorSanitizer in build-asan/. Any report
# fails its test. Integration tests spawn build-asan's own (sanitized) cohort.
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:print_summary=1 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/fuzz/lsan.supp:print_suppressions=0 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:print_summary=1

test-asan: setup
	@if [ ! -f build-asan/build.ninja ]; then rm -rf build-asan && meson setup build-asan \
		--buildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false; fi
	@meson compile -C build-asan
	@$(ASAN_ENV) meson test -C build-asan --print-errorlogs --num-processes 2 --timeout-multiplier 3 \
		--no-suite container

# libFuzzer over every harness in tests/fuzz/ for FUZZ_SECONDS each, one at a
# time, seeded from tests/fuzz/corpus/ (left untouched). Needs clang: the whole
# project is built in build-fuzz/ with -fsanitize=fuzzer-no-link,address,undefined.
# FUZZ_TARGETS picks harnesses; results and crash inputs go to build-fuzz/fuzz-runs/.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= envelope config shard idx csv npz secagg_server secagg_client secagg_wire dp_ledger
FUZZ_CXXFLAGS := -fsanitize=fuzzer-no-link -Wno-unknown-warning-option

fuzz:
	@bash scripts/setup.sh fuzz
	@if [ ! -f build-fuzz/build.ninja ]; then rm -rf build-fuzz && CC=clang CXX=clang++ \
		CXXFLAGS='$(FUZZ_CXXFLAGS)' meson setup build-fuzz --buildtype=debugoptimized -Dfuzzing=true \
		-Db_sanitize=address,undefined -Db_lundef=false; fi
	@meson compile -C build-fuzz $(addsuffix _fuzz,$(FUZZ_TARGETS))
	@bash bench/fuzz_run.sh --build build-fuzz --seconds $(FUZZ_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf build
