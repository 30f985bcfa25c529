"""ops.baselines.compiled: torch.compile with Dynamo's recompile limit raised and made an error, so a bench
over many shapes never times the eager fallback under the name torch.compile."""

from __future__ import annotations

from types import SimpleNamespace

from ops.baselines import RECOMPILE_LIMIT, compiled


def _torch(**cfg):
    calls = []
    t = SimpleNamespace(_dynamo=SimpleNamespace(config=SimpleNamespace(**cfg)))
    t.compile = lambda fn, dynamic: calls.append((fn, dynamic)) or ("compiled", fn)
    return t, calls


def test_limit_raised_and_hitting_it_is_an_error():
    t, calls = _torch(recompile_limit=8, accumulated_recompile_limit=256, fail_on_recompile_limit_hit=False)
    f = compiled(t, len)
    assert f == ("compiled", len) and calls == [(len, False)]
    assert t._dynamo.config.recompile_limit == RECOMPILE_LIMIT >= 36 * 3
    assert t._dynamo.config.accumulated_recompile_limit == RECOMPILE_LIMIT
    assert t._dynamo.config.fail_on_recompile_limit_hit is True


def test_older_torch_name_and_a_higher_limit_kept():
    t, _ = _torch(cache_size_limit=8)
    compiled(t, len)
    assert t._dynamo.config.cache_size_limit == RECOMPILE_LIMIT and not hasattr(t._dynamo.config, "recompile_limit")
    t, _ = _torch(recompile_limit=10 * RECOMPILE_LIMIT)
    compiled(t, len)
    assert t._dynamo.config.recompile_limit == 10 * RECOMPILE_LIMIT
