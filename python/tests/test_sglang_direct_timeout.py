"""Direct mode's start-up fit of kvfence's hold into SGLang's own bound on
a deferred decode-KV release (kvfence.sglang_direct.hold_budget).

SGLang (sgl-project/sglang @ f1bb745d, test_deferred_decode_kv_release.py)
frees a deferred request's pages once
SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT passed, acked or
not. kvfence holds an aborted request's pages up to max_hold_ms + the
writers' transport tail (at most max_declared_tail_ms) + clock_margin_ms
after admission, so that sum must not exceed the timeout: keys the
operator left unset are chosen to fit, explicit ones that do not are
refused at start-up, naming every value and the fixes. No SGLang here:
the variable is read from the environment, as SGLang's envs would."""
import logging
import types

import pytest

from kvfence import errors, sglang_direct

ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT"
ARGS = types.SimpleNamespace(kv_data_ptrs=[1])
KEYS = ("max_hold_ms", "max_declared_tail_ms", "clock_margin_ms")


def _bound(values):
    return sum(values[k] for k in KEYS)


def test_a_timeout_shorter_than_the_hold_is_refused(monkeypatch):
    monkeypatch.setenv(ENV, "10")
    with pytest.raises(errors.Unimplemented) as e:
        sglang_direct.refuse_at_start(ARGS, passthrough={"max_hold_ms": 60000})
    msg = str(e.value)
    assert ENV + "=10s" in msg and "max_hold_ms 60000" in msg
    # the tail (direct mode's default under 10 s: 10000/6) and the margin are named and counted
    assert "max_declared_tail_ms 1666" in msg and "clock_margin_ms 100" in msg and "= 61766 ms" in msg
    assert "at least 61.766" in msg and "max_hold_ms to at most 8234" in msg  # both ways to fix it


def test_sglangs_default_fits_kvfences_defaults(monkeypatch):
    """SGLang's default 30 s with nothing set: direct mode picks a tail
    of 5000 ms and a max_hold_ms that fill the budget, never past it."""
    monkeypatch.setenv(ENV, "30")
    assert sglang_direct.start_up_refusal(ARGS, passthrough={}) == []
    values, chosen, why = sglang_direct.hold_budget(30.0, {})
    assert why is None and set(chosen) == {"max_hold_ms", "max_declared_tail_ms"}
    assert values["max_declared_tail_ms"] == 5000 and values["max_hold_ms"] == 24900
    assert _bound(values) <= 30000 and values["lease_ms"] <= values["max_hold_ms"]
    assert sglang_direct.hold_bound_ms({}, 30.0) <= 30000


def test_chosen_keys_reach_the_library_config_and_are_logged(monkeypatch, caplog):
    monkeypatch.setenv(ENV, "30")
    caplog.set_level(logging.INFO, logger="kvfence.sglang_direct")
    p = sglang_direct.direct_hold_keys({"gpu_mode": "direct", "lease_ms": 1000})
    assert p == {"gpu_mode": "direct", "lease_ms": 1000, "max_hold_ms": 24900, "max_declared_tail_ms": 5000}
    assert len(caplog.records) == 1 and "max_hold_ms 24900 + max_declared_tail_ms 5000" in caplog.text
    # explicit values are the operator's, kept as they are
    p = sglang_direct.direct_hold_keys({"max_hold_ms": 20000, "max_declared_tail_ms": 2000, "clock_margin_ms": 500})
    assert p == {"max_hold_ms": 20000, "max_declared_tail_ms": 2000, "clock_margin_ms": 500}


@pytest.mark.parametrize("timeout", [0.5, 1, 2, 6, 10, 29.9, 30, 45, 61, 300, 3600])
def test_defaults_fit_any_timeout(timeout):
    values, chosen, why = sglang_direct.hold_budget(timeout, {})
    assert why is None, why
    assert 0 < values["lease_ms"] <= values["max_hold_ms"] <= 30000
    assert 1 <= values["max_declared_tail_ms"] <= 5000
    assert _bound(values) <= timeout * 1000


@pytest.mark.parametrize("given,named", [
    ({"max_hold_ms": 29000}, ["max_hold_ms 29000", "max_declared_tail_ms 5000", "= 34100 ms", "at least 34.1",
                              "max_hold_ms to at most 24900", "max_declared_tail_ms to at most 900"]),
    ({"max_hold_ms": 20000, "max_declared_tail_ms": 20000, "clock_margin_ms": 200},
     ["max_hold_ms 20000", "max_declared_tail_ms 20000", "clock_margin_ms 200", "= 40200 ms",
      "max_hold_ms to at most 9800", "max_declared_tail_ms to at most 9800"]),
    ({"max_declared_tail_ms": 40000}, ["no time for a hold", "max_declared_tail_ms 40000", "at least 42.1",
                                       "max_declared_tail_ms to at most 27900"]),
    ({"lease_ms": 5000, "max_declared_tail_ms": 26000}, ["lease_ms 5000", "max_hold_ms 3900", "lease_ms to at most 3900"]),
])
def test_explicit_values_that_do_not_fit_are_refused(monkeypatch, given, named):
    monkeypatch.setenv(ENV, "30")
    with pytest.raises(errors.Unimplemented) as e:
        sglang_direct.refuse_at_start(ARGS, passthrough=given)
    msg = str(e.value)
    assert ENV + "=30s" in msg
    for n in named:
        assert n in msg, (n, msg)
    with pytest.raises(errors.InvalidArgument):
        sglang_direct.direct_hold_keys(given)


def test_a_timeout_too_short_for_any_hold_is_refused():
    values, _, why = sglang_direct.hold_budget(0.05, {})
    assert why and "no time for a hold" in why and "at least" in why
    assert values["max_declared_tail_ms"] >= 1  # never 0: the library would read it as 5 min


def test_known_unsafe_check_without_the_tail_accepts_a_bound_past_the_timeout():
    """The old check (7785250) compared max_hold_ms + clock_margin_ms
    with the timeout and left the writers' tail out, which a hold also
    waits out: it accepts configurations whose real bound lies past the
    moment SGLang frees the pages. The budget with the tail refuses
    them."""
    def old_check_accepts(timeout, p):
        return timeout * 1000 >= int(p.get("max_hold_ms") or 30000) + int(p.get("clock_margin_ms") or 100)

    for timeout, p in [(30, {"max_hold_ms": 29900}), (30, {"max_hold_ms": 29000, "max_declared_tail_ms": 10000}),
                       (61, {"max_hold_ms": 60000})]:
        assert old_check_accepts(timeout, p), p
        values, _, why = sglang_direct.hold_budget(timeout, p)
        assert _bound(values) > timeout * 1000, (p, values)
        assert why, p
    # and without direct mode's tail the library's default tail (5 min) would apply
    assert sglang_direct.hold_bound_ms({"max_hold_ms": 29900}) == 29900 + 300000 + 100


def test_a_timeout_that_outwaits_the_hold_is_accepted(monkeypatch):
    monkeypatch.setenv(ENV, "65.1")
    assert sglang_direct.start_up_refusal(ARGS, passthrough={"max_hold_ms": 60000}) == []
    monkeypatch.setenv(ENV, "65")
    assert sglang_direct.start_up_refusal(ARGS, passthrough={"max_hold_ms": 60000})


def test_no_timeout_known_no_refusal(monkeypatch):
    """An SGLang that declares no timeout (it waits for the manager, or
    retries the abort) leaves nothing to compare, and nothing is chosen."""
    monkeypatch.delenv(ENV, raising=False)
    assert sglang_direct.release_timeout_refusal({"max_hold_ms": 60000}) is None
    assert sglang_direct.direct_hold_keys({"max_hold_ms": 60000}) == {"max_hold_ms": 60000}


def test_without_the_deferred_release_the_timeout_is_not_the_reason(monkeypatch):
    monkeypatch.setenv("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", "false")
    monkeypatch.setenv(ENV, "1")
    why = sglang_direct.start_up_refusal(ARGS, passthrough={})
    assert len(why) == 1 and "no deferred decode-KV release" in why[0]
