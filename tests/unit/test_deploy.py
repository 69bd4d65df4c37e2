"""The shipped deployments of the preprocessing workers (deploy/), checked offline: the
Kubernetes manifests are well-formed and wired together (selector, secret keys, ports,
every variable the arguments use), the Slurm script runs (srun, hostname and stoker
stood in for by recorders) and both give `stoker preprocess-worker` arguments its own
parser takes, offering the worker to the coordinator at the address it serves."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stoker.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def worker_args(argv: list[str]) -> Any:
    args = build_parser().parse_args(argv)
    assert args.command == "preprocess-worker"
    return args


def test_the_kubernetes_deployment_is_wired_together() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "preprocess-workers.yaml").read_text()))
    by_kind = {d["kind"]: d for d in docs}
    assert set(by_kind) == {"Secret", "Deployment"}
    secret, deploy = by_kind["Secret"], by_kind["Deployment"]
    assert deploy["apiVersion"] == "apps/v1" and secret["apiVersion"] == "v1"
    spec = deploy["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e for e in c["env"]}
    for e in env.values():  # every secret reference names a key the Secret has
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    used = {m for a in c["args"] for m in re.findall(r"\$\((\w+)\)", a)}
    assert used <= set(env), f"arguments use undefined variables {used - set(env)}"
    values = {**{k: e.get("value", "") for k, e in env.items()}, "POD_IP": "10.1.2.3"}
    argv = [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)] or "x", a) for a in c["args"]]
    assert c["command"] == ["stoker"]
    args = worker_args(argv)
    port = c["ports"][0]["containerPort"]
    assert args.bind == f"0.0.0.0:{port}" and args.advertise == f"10.1.2.3:{port}"
    assert c["readinessProbe"]["tcpSocket"]["port"] == port
    assert args.coordinator == env["STOKER_COORDINATOR"]["value"]
    assert "STOKER_COORDINATOR_TOKEN" in env  # (the coordinator answers only with it)
    # the token file is the secret's "token" key, mounted read-only
    (mount,) = c["volumeMounts"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert mount["readOnly"] is True and vol["secret"]["secretName"] == secret["metadata"]["name"]
    (item,) = vol["secret"]["items"]
    assert item["key"] in secret["stringData"]
    assert args.token_file == f"{mount['mountPath']}/{item['path']}"


def _recorder(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_the_slurm_script_starts_one_worker_a_node_offered_to_the_coordinator(
    tmp_path: Path,
) -> None:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    out = tmp_path / "calls.jsonl"
    # srun runs its command once (one node here), saying how it was asked
    _recorder(bin_ / "srun", f'echo "srun $*" >> {out}.srun\nshift\nexec "$@"\n')
    _recorder(bin_ / "hostname", 'echo "10.9.8.7 fe80::1"\n')
    _recorder(
        bin_ / "stoker",
        f"python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> {out}\n",
    )
    env = {"PATH": f"{bin_}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    script = DEPLOY / "slurm" / "preprocess-workers.sbatch"
    missing = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "STOKER_COORDINATOR" in missing.stderr
    env["STOKER_COORDINATOR"] = "trainer-0:7070"
    subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True, text=True)
    assert "--ntasks-per-node=1" in Path(f"{out}.srun").read_text()
    (argv,) = [json.loads(line) for line in out.read_text().splitlines()]
    args = worker_args(argv)
    assert args.bind == "0.0.0.0:7090" and args.advertise == "10.9.8.7:7090"
    assert args.coordinator == "trainer-0:7070"
    assert args.token_file == f"{tmp_path}/.stoker/preprocess.token"


@pytest.mark.parametrize("bind", ["0.0.0.0:7090", "[::]:7090"])
def test_a_worker_bound_to_every_address_must_say_where_it_is_reached(
    bind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(What the manifests' --advertise is for: the CLI refuses to offer 0.0.0.0, before
    it binds anything.)"""
    from stoker.cli import main

    token = tmp_path / "token"
    token.write_text("t")
    argv = ["preprocess-worker", "--bind", bind, "--token-file", str(token)]
    assert main([*argv, "--coordinator", "127.0.0.1:1"]) == 2
    assert "--advertise" in capsys.readouterr().err
