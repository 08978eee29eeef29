"""The fake engines read integer query arguments with the one integer parser (regression):
``"²".isdigit()`` is True and ``int("²")`` raises, so ``/v1/loads?dp_rank=²`` (SGLang) and
``/sleep?level=²`` (vLLM) were 500s with a traceback instead of the engines' answers."""

from __future__ import annotations

import httpx
import pytest

from smgrl.fake import fake_fleet

ODD = ["%C2%B2", "%D9%A3", "1_0", "9" * 5000]


@pytest.mark.parametrize("value", ODD)
async def test_sglang_loads_ignores_a_dp_rank_that_is_not_a_number(value):
    async with (
        fake_fleet("sglang", dp_size=2) as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0], timeout=30) as c,
    ):
        r = await c.get(f"/v1/loads?dp_rank={value}")
        assert r.status_code == 200, r.text
        assert [row["dp_rank"] for row in r.json()["loads"]] == [0, 1]  # not a number: no filter
        one = await c.get("/v1/loads?dp_rank=01")
        assert [row["dp_rank"] for row in one.json()["loads"]] == [1]


@pytest.mark.parametrize("value", ODD)
async def test_vllm_sleep_refuses_a_level_that_is_not_a_number(value):
    async with fake_fleet("vllm") as fleet, httpx.AsyncClient(base_url=fleet.urls[0], timeout=30) as c:
        r = await c.post(f"/sleep?level={value}")
        assert r.status_code in (400, 422), r.text
        assert fleet.engines[0].sleep_level is None
