import json, urllib.request, urllib.error, subprocess
import pytest
from test_workers_forwarding import start, raw_post, turn, request
pytestmark = pytest.mark.e2e

def get(base, path, headers=None):
    req = urllib.request.Request(base + path, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()[:300]
    except urllib.error.HTTPError as e:
        return e.code, e.read()[:300]

def test_probe(fakes, children, tmp_path):
    journal, base, pids, a, b = start(fakes, children, tmp_path)
    print("\nA", a.url, "B", b.url)
    print(subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout)
    st, _, body = request(a.url, "POST", "/sessions")
    sid = body["session_id"]
    for hdr in ({"x-smgrl-forwarded": "1"}, {"x-smgrl-forwarded": "2"}, {"x-smgrl-forwarded": "-1"},
                {"x-smgrl-forwarded": "abc"}, {"x-smgrl-forwarded": "9" * 5000},
                {"x-smgrl-forwarded-to": "zzz"}, {"x-smgrl-forwarded-to": b.owner, "x-smgrl-forwarded": "1"}):
        st, h, text = raw_post(b.url, f"/sessions/{sid}/v1/chat/completions", turn(1))
        st2, h2, text2 = raw_post(b.url, f"/sessions/{sid}/v1/chat/completions", turn(2), headers=hdr)
        print("HDR", {k: v[:20] for k, v in hdr.items()}, st2, text2[:200])
    for forged in ("abcdefabcdef-" + "0" * 32, "x" * 5000, "%00%01%ff", "a" * 12 + "-" + "f" * 32 + "/../../v1/rl/workers", a.owner + "-" + "0" * 32):
        st, h, text = raw_post(b.url, f"/sessions/{forged}/v1/chat/completions", turn(1))
        print("FORGED", forged[:40], st, text[:200])
        print("  GET", get(b.url, f"/sessions/{forged}"))
    # TITO header forged
    for tito in ("x" * 5000, "\x01bad", a.owner + "-" + "0" * 32):
        try:
            st, h, text = raw_post(b.url, "/v1/chat/completions", turn(1), headers={"x-smg-tito-session-id": tito})
        except Exception as exc:
            st, text = "EXC", repr(exc)
        print("TITO", repr(tito[:30]), st, text[:200])
    import time
    for size in (1, 4):
        big = turn(3); big["messages"][0]["content"] += "x" * (size * 1024 * 1024)
        for via in (a.url, b.url):
            t = time.monotonic()
            try:
                st, h, text = raw_post(via, f"/sessions/{sid}/v1/chat/completions", big, timeout=120)
            except Exception as exc:
                st, text = "EXC", repr(exc)
            print("BIG", size, "via", "A" if via == a.url else "B", st, round(time.monotonic() - t, 1), text[:150])
