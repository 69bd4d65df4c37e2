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


# ---------------------------------------------------------------- the training recipes


def test_every_kubernetes_manifest_is_valid_against_the_kubernetes_schemas() -> None:
    import kubernetes_validate

    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(doc, "1.33.0", strict=True)  # (raises on a fault)
    # (the validator does validate: a field the schema lacks is refused)
    job = next(d for d in _docs("training.yaml") if d["kind"] == "Job")
    job["spec"]["template"]["spec"]["containers"][0]["enviroment"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, "1.33.0", strict=True)


def _docs(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def test_the_kubernetes_training_job_is_wired_together() -> None:
    import torch.distributed.run

    from stoker import train

    by_kind = {d["kind"]: d for d in _docs("training.yaml")}
    agent, service, job = by_kind["DaemonSet"], by_kind["Service"], by_kind["Job"]
    claim = by_kind["PersistentVolumeClaim"]
    spec = job["spec"]
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    argv = _expand(c["args"], env)
    assert c["command"] == ["torchrun"]
    run = torch.distributed.run.get_args_parser().parse_args(argv)
    assert run.module and run.training_script == "stoker.train"
    args = train.parse(run.training_script_args)
    # one pod a node, found by name: pod 0 of the Indexed Job through the headless Service
    assert int(run.nnodes) == spec["completions"] == spec["parallelism"]
    assert spec["completionMode"] == "Indexed" and run.rdzv_backend == "c10d"
    assert service["spec"]["clusterIP"] == "None"
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    host, port = run.rdzv_endpoint.rsplit(":", 1)
    assert host == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    assert int(port) in {p["containerPort"] for p in c["ports"]}
    assert int(run.nproc_per_node) == c["resources"]["limits"]["nvidia.com/gpu"]
    # the agent and the ranks: one cache directory and one /dev/shm a node, one user
    (a,) = agent["spec"]["template"]["spec"]["containers"]
    agent_args = build_parser().parse_args(a["args"])
    assert agent_args.command == "agent" and agent_args.cache_dir == args.cache_dir

    def mounts(podspec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
        vols = {v["name"]: v for v in podspec["volumes"]}
        return {m["mountPath"]: vols[m["name"]] for m in container["volumeMounts"]}

    agent_pod = agent["spec"]["template"]["spec"]
    theirs, ours = mounts(agent_pod, a), mounts(pod, c)
    for path in (args.cache_dir, "/dev/shm"):
        assert theirs[path]["hostPath"]["path"] == ours[path]["hostPath"]["path"], path
    assert agent_pod["securityContext"]["runAsUser"] == pod["securityContext"]["runAsUser"]
    (init,) = agent_pod["initContainers"]  # the hostPath made the agent's user's
    assert init["command"][-2:] == ["1000:1000", args.cache_dir]
    # the checkpoint on the claim, on every pod
    ck = next(p for p in ours if args.checkpoint.startswith(p + "/"))
    assert ours[ck]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert "ReadWriteMany" in claim["spec"]["accessModes"]


def test_the_slurm_training_script_runs_one_torchrun_a_node_with_the_first_as_rendezvous(
    tmp_path: Path,
) -> None:
    import torch.distributed.run

    from stoker import train

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    out = tmp_path / "calls"
    _recorder(bin_ / "srun", f'echo "srun $*" >> {out}.srun\nwhile [ "${{1#-}}" != "$1" ]; do '
              'shift; done\nexec "$@"\n')  # fmt: skip
    _recorder(bin_ / "scontrol", 'printf "gpu-node-7\\ngpu-node-8\\n"\n')
    _recorder(
        bin_ / "torchrun",
        f"python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> {out}\n",
    )
    env = {"PATH": f"{bin_}:{os.environ['PATH']}", "HOME": str(tmp_path),
           "SLURM_JOB_NODELIST": "gpu-node-[7-8]", "SLURM_NNODES": "2",
           "SLURM_JOB_ID": "4242", "SLURM_SUBMIT_DIR": str(DEPLOY.parent)}  # fmt: skip
    script = DEPLOY / "slurm" / "train.sbatch"
    missing = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "DATASET" in missing.stderr
    env.update(DATASET="s3://b/tokens", CHECKPOINT="/shared/run1")
    subprocess.run(["bash", str(script), "--steps", "10"], env=env, check=True,
                   capture_output=True, text=True)  # fmt: skip
    assert "--ntasks-per-node=1" in Path(f"{out}.srun").read_text()
    (argv,) = [json.loads(line) for line in out.read_text().splitlines()]
    run = torch.distributed.run.get_args_parser().parse_args(argv)
    assert run.nnodes == "2" and run.rdzv_endpoint == "gpu-node-7:29400"
    assert run.rdzv_backend == "c10d" and run.rdzv_id == "4242"
    args = train.parse(run.training_script_args)
    assert (args.dataset, args.checkpoint, args.steps) == ("s3://b/tokens", "/shared/run1", 10)
    assert args.cache_dir == "/tmp/stoker-4242"
