"""SMG's own Python client (`smg.rl` from the PyPI wheel smg==1.13.0) works against smgrl unchanged.

The wheel is large (a Rust extension), but `smg/rl.py` is standard-library only: the test downloads
the wheel (pip's cache makes repeats cheap), loads just that file, and drives a real smgrl process
with it. Set SMG_RL_FILE=/path/to/smg/rl.py to use a local copy; without network the test skips.
"""

import importlib.util
import json
import os
import subprocess
import sys
import urllib.request
import zipfile

import pytest

from smgrl.demo.procs import wait_for_workers
from smgrl.fake.checkpoint import make_checkpoint


@pytest.fixture(scope="module")
def smg_rl(tmp_path_factory):
    path = os.environ.get("SMG_RL_FILE")
    if not path:
        where = tmp_path_factory.mktemp("smg-wheel")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(where), "smg==1.13.0"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        wheels = list(where.glob("smg-1.13.0-*.whl"))
        if proc.returncode != 0 or not wheels:
            pytest.skip(f"smg==1.13.0 could not be downloaded: {proc.stderr.strip()[-200:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            path = str(where / "rl.py")
            with open(path, "wb") as out:
                out.write(wheel.read("smg/rl.py"))
    spec = importlib.util.spec_from_file_location("smg_rl_from_wheel", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def knobs(url: str, **values) -> None:
    req = urllib.request.Request(
        f"{url}/_fake/knobs",
        data=json.dumps(values).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()


def test_smg_client_drives_a_refit_through_smgrl(smg_rl, fakes, gateway, tmp_path):
    urls = fakes("sglang", 3)
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", "--worker-urls", *urls)
    wait_for_workers(http.base, 3, child=gw)
    rl = smg_rl.RL(http.base, timeout=60)

    workers = rl.workers()
    assert len(workers) == 3 and all(isinstance(w, smg_rl.Worker) for w in workers)
    assert {w.engine for w in workers} == {"sglang"} and all(w.control_url == w.base_url for w in workers)
    assert rl.worker(workers[0].id).id == workers[0].id

    ckpt = make_checkpoint(tmp_path / "step-3", "smg-client/step-3")
    with smg_rl.paused(rl, "engine=sglang") as pause:
        assert pause.succeeded == pause.total == 3
        result = rl.fanout(
            "update_weights_from_disk",
            {"model_path": str(ckpt), "weight_version": "3", "flush_cache": True},
            selector="engine=sglang",
        )
        assert isinstance(result, smg_rl.FanoutResult) and result.succeeded == 3
    reply = rl.call(workers[0].id, "generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert isinstance(reply, smg_rl.CallResult) and reply.status == 200
    assert reply.body["meta_info"]["weight_version"] == "3"

    # An engine 4xx is a result, not an exception; a gateway error is an RlError with its code.
    bad = rl.call(workers[0].id, "pause_generation", None)
    assert bad.status == 400
    with pytest.raises(smg_rl.RlError) as err:
        rl.call("no-such-worker", "flush_cache")
    assert err.value.code == "worker_not_found"
    with pytest.raises(smg_rl.RlError) as err:
        rl.fanout("flush_cache", selector="engine==sglang")
    assert err.value.code == "invalid_selector"

    # A partial fan-out raises FanoutError naming the failed worker, unless allow_partial.
    knobs(urls[1], force_status=500)
    with pytest.raises(smg_rl.FanoutError) as err:
        rl.fanout("flush_cache", selector="engine=sglang")
    failed_id = err.value.result.failed[0].worker_id
    assert failed_id in str(err.value)
    partial = rl.fanout("flush_cache", selector="engine=sglang", allow_partial=True)
    assert partial.succeeded == 2 and partial.total == 3
