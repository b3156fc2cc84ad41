"""Direct mode's start-up check of SGLang's own bound on a deferred
decode-KV release (kvfence.sglang_direct.release_timeout_refusal).

SGLang (sgl-project/sglang @ f1bb745d, test_deferred_decode_kv_release.py)
frees a deferred request's pages once
SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT passed, acked or
not. kvfence holds an aborted request's pages up to max_hold_ms +
clock_margin_ms after admission (and a writer's tail on top), so a shorter
timeout lets SGLang reuse pages a late write may still reach: refused at
start-up, naming both values and the fix. No SGLang here: the variable is
read from the environment, as SGLang's envs would."""
import types

import pytest

from kvfence import errors, sglang_direct

ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT"
ARGS = types.SimpleNamespace(kv_data_ptrs=[1])


def test_a_timeout_shorter_than_the_hold_is_refused(monkeypatch):
    monkeypatch.setenv(ENV, "10")
    with pytest.raises(errors.Unimplemented) as e:
        sglang_direct.refuse_at_start(ARGS, passthrough={"max_hold_ms": 60000})
    msg = str(e.value)
    assert ENV + "=10s" in msg and "60100 ms" in msg and "max_hold_ms 60000" in msg
    assert "at least 60.1" in msg and "at most 9900" in msg  # both ways to fix it


def test_sglangs_default_against_kvfences_default_is_refused(monkeypatch):
    """SGLang's default 30 s against kvfence's 30 s + 100 ms margin: the
    margin alone is a window where SGLang frees first."""
    monkeypatch.setenv(ENV, "30")
    assert sglang_direct.release_timeout_refusal({})
    assert sglang_direct.release_timeout_refusal({"max_hold_ms": 29900}) is None


def test_a_timeout_that_outwaits_the_hold_is_accepted(monkeypatch):
    monkeypatch.setenv(ENV, "61")
    assert sglang_direct.start_up_refusal(ARGS, passthrough={"max_hold_ms": 60000}) == []


def test_no_timeout_known_no_refusal(monkeypatch):
    """An SGLang that declares no timeout (it waits for the manager, or
    retries the abort) leaves nothing to compare."""
    monkeypatch.delenv(ENV, raising=False)
    assert sglang_direct.release_timeout_refusal({"max_hold_ms": 60000}) is None


def test_without_the_deferred_release_the_timeout_is_not_the_reason(monkeypatch):
    monkeypatch.setenv("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", "false")
    monkeypatch.setenv(ENV, "1")
    why = sglang_direct.start_up_refusal(ARGS, passthrough={})
    assert len(why) == 1 and "no deferred decode-KV release" in why[0]
