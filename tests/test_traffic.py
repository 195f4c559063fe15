"""utils.check_traffic: advice (or, where an exercise says so, rejection) from the bytes a
profiled launch moved against the bytes it needed."""
import types

import pytest

import utils


def fake_profile(moved, needed, summary=()):
    return types.SimpleNamespace(bytes_moved=moved, bytes_needed=needed, summary=list(summary),
                                 backend="cuda-emulator")


def test_coalesced_traffic_passes_quietly(capsys):
    p = fake_profile(8192, 8192)
    assert utils.check_traffic(p) is p
    out = capsys.readouterr().out
    assert "1.00x" in out and "coalesced" in out and "advice" not in out


def test_a_little_slack_for_misaligned_starts(capsys):
    utils.check_traffic(fake_profile(8192 + 64, 8192), reject=True)  # 2 extra sectors: fine
    assert "coalesced" in capsys.readouterr().out


def test_strided_traffic_gets_advice_with_the_ratio_and_the_worst_site(capsys):
    worst = "each warp's load of `x` (line 7) touches 16 sectors where 4 would do"
    utils.check_traffic(fake_profile(4 * 8192, 8192, [worst, "second"]))
    out = capsys.readouterr().out
    assert out.startswith("advice: your kernel moves 4.0x the bytes it needs")
    assert worst in out and "second" not in out


def test_reject_only_when_asked():
    with pytest.raises(utils.GradingError, match=r"moves 4\.0x the bytes it needs"):
        utils.check_traffic(fake_profile(4 * 8192, 8192), reject=True)
    with pytest.raises(utils.GradingError, match=r"1\.5x"):
        utils.check_traffic(fake_profile(12288, 8192), max_ratio=1.1, reject=True)


def test_a_profile_without_byte_counts_is_reported_not_judged(capsys):
    utils.check_traffic(types.SimpleNamespace(bytes_moved=None, bytes_needed=None, backend="ncu"),
                        reject=True)
    assert "not measured" in capsys.readouterr().out
