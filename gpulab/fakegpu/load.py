"""Traffic that flows: ``gpulab load svc/NAME RPS`` runs a request generator against a Service.

The generator is a Deployment of one pod, ``load-NAME``, in the Service's
namespace: the ``gpulab/llm-server`` image in its ``loadgen`` mode (see
:mod:`gpulab.fakegpu.llmserver`), sending OpenAI completions at a fixed rate
to ``http://NAME.NAMESPACE.svc:PORT/v1/completions`` through cluster DNS and
kube-proxy, as any client in the cluster would, until it is stopped. The
replicas that answer compute for each request, and the GPU utilization they
report reaches nvidia-smi, the DCGM exporter and whatever scales on it: an HPA
on ``DCGM_FI_DEV_GPU_UTIL`` sees the traffic that really arrives, shared the
way kube-proxy shares it among the ready endpoints.

``gpulab load svc/llm 0`` deletes the generator; a new rate replaces the
running one (a rolling update of its Deployment). Everything it creates is an
ordinary object a learner can read (``kubectl get deploy load-llm -o yaml``,
``kubectl logs deploy/load-llm``: one line per second).

A pod's own ``gpulab.io/gpu-utilization`` annotation (see
:mod:`gpulab.fakegpu.ledger`) is a fixed load that needs no traffic.
"""

from __future__ import annotations

import re
from typing import Any

from ..i18n import _
from ..kube import api
from .llmserver import IMAGE, MAX_TOKENS_LIMIT

KINDS = ("svc", "service", "services")
MAX_RPS = 1000
PATH = "/v1/completions"
#: The generator's labels: what it is, and which Service it loads.
COMPONENT_LABEL = "app.kubernetes.io/name"
COMPONENT = "gpulab-load"
TARGET_LABEL = "gpulab.io/load-target"


class LoadError(ValueError):
    """A malformed target or rate, or a Service that cannot take traffic; the message says what is allowed."""


def parse_target(target: str) -> str:
    """``svc/llm`` -> ``"llm"``."""
    kind, sep, name = target.partition("/")
    if not sep or not name:
        raise LoadError(_("target {target!r}: expected svc/NAME, the Service that receives the requests "
                          "(e.g. svc/llm)", target=target))
    if kind.lower() not in KINDS:
        raise LoadError(_("target {target!r}: traffic goes to a Service, not a {kind!r}; "
                          "use svc/NAME (kinds: {kinds})", target=target, kind=kind, kinds=", ".join(KINDS)))
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 63:
        raise LoadError(_("target {target!r}: {name!r} is not a valid Service name "
                          "(lowercase letters, digits and '-', starting with a letter, at most 63)",
                          target=target, name=name))
    return name


def parse_rps(value: str) -> float:
    """Requests per second: a number from 0 (stop) to :data:`MAX_RPS`."""
    try:
        rps = float(str(value).strip())
    except ValueError:
        raise LoadError(_("rate {value!r}: expected requests per second, a number such as 5 or 0.5 "
                          "(0 stops the traffic)", value=value)) from None
    if rps != rps or rps < 0 or rps > MAX_RPS:  # NaN fails the first test
        raise LoadError(_("rate {value!r}: must be between 0 and {most} requests per second", value=value,
                          most=MAX_RPS))
    return rps


def parse_max_tokens(value: int) -> int:
    if not 1 <= value <= MAX_TOKENS_LIMIT:
        raise LoadError(_("--max-tokens {value}: must be between 1 and {most}", value=value, most=MAX_TOKENS_LIMIT))
    return value


def generator_name(service: str) -> str:
    return f"load-{service}"[:63].rstrip("-")


def service_url(service: dict[str, Any], port: str | None = None) -> str:
    """The completions URL of ``service`` by its DNS name; ``port`` picks one of its ports (name or number)."""
    meta, ports = service["metadata"], (service.get("spec") or {}).get("ports") or []
    where = f"{meta.get('namespace', 'default')}/{meta['name']}"
    if (service.get("spec") or {}).get("clusterIP") == "None":
        raise LoadError(_("Service {service} is headless (clusterIP: None): it has no virtual IP for kube-proxy to "
                          "balance; send traffic to a Service with a ClusterIP", service=where))
    if not ports:
        raise LoadError(_("Service {service} has no ports", service=where))
    if port is None:
        chosen = ports[0]
    else:
        chosen = next((p for p in ports if port in (p.get("name"), str(p.get("port")))), None)
        if chosen is None:
            allowed = ", ".join(f"{p.get('name') or '-'}:{p['port']}" for p in ports)
            raise LoadError(_("Service {service} has no port {port!r}; its ports: {ports}", service=where, port=port,
                              ports=allowed))
    return f"http://{meta['name']}.{meta.get('namespace', 'default')}.svc:{chosen['port']}{PATH}"


def generator(service: dict[str, Any], rps: float, max_tokens: int = 16, port: str | None = None) -> dict[str, Any]:
    """The Deployment that sends ``rps`` completions per second to ``service``."""
    name = service["metadata"]["name"]
    labels = {COMPONENT_LABEL: COMPONENT, TARGET_LABEL: name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": generator_name(name), "namespace": service["metadata"].get("namespace", "default"),
                     "labels": labels},
        "spec": {
            "replicas": 1,
            # The old rate stops before the new one starts: never both at once.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "loadgen", "image": IMAGE,
                        "args": ["loadgen", service_url(service, port), "--rps", f"{rps:g}", "--duration", "0",
                                 "--max-tokens", str(max_tokens)],
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                    }],
                },
            },
        },
    }


def set_load(client: api.Client, target: str, rps: str, namespace: str, max_tokens: int = 16,
             port: str | None = None) -> str:
    """Start, change or (rate 0) stop the traffic to ``target``; returns what was done, in one line."""
    name, rate = parse_target(target), parse_rps(rps)
    parse_max_tokens(max_tokens)
    service = client.get("Service", name, namespace)
    if service is None:
        raise LoadError(_("Service {namespace}/{name} not found (kubectl -n {namespace} get services)",
                          namespace=namespace, name=name))
    deployment = generator_name(name)
    if rate == 0:
        if client.get("Deployment", deployment, namespace) is None:
            return _("no traffic to service/{name}: nothing to stop", name=name)
        client.delete("Deployment", deployment, namespace)
        return _("deployment.apps/{deployment} deleted: no more traffic to service/{name}", deployment=deployment,
                 name=name)
    manifest = generator(service, rate, max_tokens, port)
    url = manifest["spec"]["template"]["spec"]["containers"][0]["args"][1]
    existed = client.get("Deployment", deployment, namespace) is not None
    client.apply(manifest)
    done = dict(deployment=deployment, rate=rate, tokens=max_tokens, url=url)
    if existed:
        return _("deployment.apps/{deployment} configured: {rate:g} requests/s of {tokens} tokens to {url} "
                 "(kubectl logs deploy/{deployment} -f)", **done)
    return _("deployment.apps/{deployment} created: {rate:g} requests/s of {tokens} tokens to {url} "
             "(kubectl logs deploy/{deployment} -f)", **done)
