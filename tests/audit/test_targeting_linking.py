"""The linking and log attacks of `audit targeting`, against the real issuer, gateway, log and
witness: every attack fails (0/N) while the honest baseline is accepted (N/N); and each attack does
succeed against a client that skips the check it targets, so the rows can fail."""

import pytest

from traceless_tools.audit import targeting_linking as tl
from traceless_tools.audit.targeting_linking import LINKING_STRATEGIES, measure_linking

TRIALS = 5


@pytest.fixture(scope="module")
def rows():
    return {r.strategy: r for r in measure_linking(TRIALS)}


@pytest.mark.parametrize("strategy", LINKING_STRATEGIES)
def test_every_linking_attack_fails_and_the_honest_baseline_passes(rows, strategy):
    r = rows[strategy]
    assert r.trials == TRIALS and r.attack_successes == 0 and r.honest_accepted == TRIALS and r.detected
    j = r.to_json()
    assert j["attack_95ci"][0] == 0.0 and 0 < j["attack_95ci"][1] < 0.6
    assert j["honest_95ci"][1] == 1.0 and j["honest_95ci"][0] > 0.4


def test_the_attacks_succeed_against_a_client_without_the_checks(monkeypatch):
    """Disable each check the rows rely on: the same attacks then succeed (the harness can see them)."""
    from traceless.privacy.privacypass.http import b64url_decode
    from traceless.privacy.privacypass.keys import IssuerPublicKey
    from traceless_tools.client.tokens import TokenWallet

    async def unchecked_challenge(self, key):  # the relayed copy, not compared with the public one
        return await self._challenge_from(self._config.relay_url, key)

    async def any_offered_key(self):  # accept whatever key the directory shows
        r = await self._http.get(self._config.issuer_url.rstrip("/") + "/token-issuer-directory")
        return IssuerPublicKey.from_spki(b64url_decode(r.json()["token-keys"][0]["token-key"], "token-key"))

    monkeypatch.setattr(TokenWallet, "_checked_challenge", unchecked_challenge)
    monkeypatch.setattr(TokenWallet, "_issuer_key", any_offered_key)
    with tl.world() as w:
        assert tl.unique_challenge(w, 2).attack_successes == 2
        assert tl.issuer_key_tagging(w, 2).attack_successes == 2


def test_a_client_without_a_witness_or_saved_head_accepts_the_fork(tmp_path):
    from traceless.privacy.translog.client import LogClient

    with tl.world() as w:
        with LogClient(w.log_url, w.log_key) as before:
            before.update()
        with tl.forked_log(w.dir / "log"), LogClient(w.log_url, w.log_key) as naive:
            assert naive.update().root_hash != before.last_sth.root_hash  # accepted: nothing to compare with
