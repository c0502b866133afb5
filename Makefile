# A thin front over the set-up script and Meson (build directory: build/).
.PHONY: all setup build test demo bench clean

all: build

setup:
	@bash scripts/setup.sh

# Re-configures a missing or half-made build directory; ninja re-runs Meson
# itself when a meson.build changed.
build: setup
	@if [ ! -f build/build.ninja ]; then rm -rf build && meson setup build --buildtype=release; fi
	@meson compile -C build

test: build
	@meson test -C build --print-errorlogs --num-processes 2

demo: build
	@bash scripts/demo.sh

bench: build
	@bash bench/run.sh

clean:
	rm -rf build
