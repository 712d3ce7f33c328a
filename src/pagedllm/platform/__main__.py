"""`python -m pagedllm.platform`: print this machine's platform, CPU features and kernel
plan; `--build-all` builds every kernel variant of the architecture into the cache (a
Docker image does, so containers on any CPU start without compiling)."""

from __future__ import annotations

import argparse
import sys

from pagedllm.kernels import build
from pagedllm.kernels.variants import variants_for_arch
from pagedllm.platform import cpu_platform, current_platform
from pagedllm.platform.cpu_features import detect


def main(argv: list[str] | None = None) -> int:
    """Print the plan (and build); exit code 1 when a requested build failed."""
    parser = argparse.ArgumentParser(prog="python -m pagedllm.platform", description=__doc__)
    parser.add_argument("--build-all", action="store_true", help="build every kernel variant")
    args = parser.parse_args(argv)
    features = detect()
    print(f"features ({features.source}): {' '.join(sorted(features.flags)) or '-'}")
    print(f"plan: {cpu_platform().describe()}")
    print(f"platform: {current_platform().device_type}")
    if not args.build_all:
        return 0
    failed = False
    for variant in variants_for_arch(features.arch):
        try:
            print(f"{variant.name}: {build.build_variant(variant)}")
        except build.BuildError as exc:
            print(f"{variant.name}: FAILED {exc}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
