"""`traceless audit targeting`: the non-targetability definition made executable.

Threat T13 (docs/threat-model.md): servers S_1..S_n with capacity C(S_i); for any set T of servers an attacker
controls, a given user's request must land in T with probability sum C(T) / sum C(S). For each
routing policy and an attacker strategy that fits it, N target requests are routed and
P(target in T) is estimated with a 95% Wilson interval; the attacker "beats its share" when the
interval's lower bound is above the share. A chi-square test compares the per-node landing
counts with the capacity shares.

Ours (`capacity_random`) runs on the real gateway under every strategy (targeting_gateway.py).
The linking and log attacks (unique challenges, issuer key tagging, log fork) run against the real
issuer, gateway, log and witness with the client's own checks (targeting_linking.py): each row is
the attack's success rate next to the honest baseline's acceptance rate.
The attacks of colluding hops (pairing tagger, issuer key partition, forced refill, node aliases,
retry steering: targeting_collusion*.py, targeting_refill.py) are each measured three times: the
honest baseline, the attack on our client, and the attack on a deliberately weakened client, each
with a 99.99% interval against the fair level (1/users for linking, T's share for routing).
Anonymous amplification (amplification.py): the attestation work one nonce-bound listing request
makes every node do, with a token, without one, and against the design before.
The production-style routers (least-loaded, user affinity, prefix-aware, priority class) are
SIMULATIONS (targeting_policies.py, targeting_sim.py), each under no attack and under the
strategy that fits it, to show the harness detects targeting where it exists.
"""

from __future__ import annotations

from traceless_tools.audit.amplification import AmplificationRow, measure_amplification, print_amplification
from traceless_tools.audit.targeting_collusion import CollusionRow, measure_collusion_linking
from traceless_tools.audit.targeting_collusion_routing import measure_collusion_routing
from traceless_tools.audit.targeting_estimate import AT, BEATS, Estimate, Scenario
from traceless_tools.audit.targeting_gateway import GATEWAY_STRATEGIES, GatewayAttackConfig, measure_gateway
from traceless_tools.audit.targeting_linking import LinkingEstimate, measure_linking
from traceless_tools.audit.targeting_sim import SIM_PLAN, Workload, simulate
from traceless_tools.report.output import figure, finish


def measure_all(
    scenario: Scenario,
    gateway_cfg: GatewayAttackConfig = GatewayAttackConfig(),
    workload: Workload = Workload(),
    progress=None,
) -> list[Estimate]:
    """Ours on the real gateway under every strategy, then every simulated (policy, strategy)."""
    results = []
    for strategy in GATEWAY_STRATEGIES:
        results.append(measure_gateway(strategy, scenario, gateway_cfg))
        if progress is not None:
            progress.update(1)
    for policy, strategy in SIM_PLAN:
        results.append(simulate(policy, strategy, scenario, workload))
        if progress is not None:
            progress.update(1)
    return results


def build_report(
    scenario: Scenario,
    results: list[Estimate],
    linking: list[LinkingEstimate] | None = None,
    collusion: list[CollusionRow] | None = None,
    amplification: list[AmplificationRow] | None = None,
) -> dict:
    ours = [r for r in results if not r.simulated]
    sims = [r for r in results if r.simulated]
    beaten = sorted({r.policy for r in sims if r.strategy != "none" and r.verdict == BEATS})
    biased = sorted({r.policy for r in sims if r.strategy == "none" and r.verdict != AT})
    return {
        "audit": "targeting",
        "capacities": list(scenario.capacities),
        "attacker_nodes": sorted(scenario.attacker_nodes),
        "requests_per_row": scenario.requests,
        "seed": scenario.seed,
        "confidence": 0.95,
        "results": [r.to_json() for r in results],
        "summary": {
            "ours_beaten": any(r.verdict == BEATS for r in ours),
            "simulated_policies_beaten": beaten,
            "simulated_policies_off_share_without_attack": biased,
            "linking_attacks_succeeded": sorted(r.strategy for r in linking or () if not r.detected),
            "collusion_rows_failed": sorted(r.strategy for r in collusion or () if not r.passed),
            "amplification_rows_failed": sorted(r.strategy for r in amplification or () if not r.passed),
        },
        "linking": [r.to_json() for r in linking or ()],
        "collusion": [r.to_json() for r in collusion or ()],
        "amplification": [r.to_json() for r in amplification or ()],
    }


def run(
    scenario: Scenario,
    json_path: str | None = None,
    plot_path: str | None = None,
    gateway_cfg: GatewayAttackConfig = GatewayAttackConfig(),
    linking_trials: int = 30,
) -> dict:
    from tqdm.auto import tqdm

    with tqdm(total=len(GATEWAY_STRATEGIES) + len(SIM_PLAN), desc="policy x strategy", unit="row") as bar:
        results = measure_all(scenario, gateway_cfg, progress=bar)
    linking = measure_linking(linking_trials) if linking_trials > 0 else []
    collusion = measure_collusion_routing(scenario, scenario.requests)
    if linking_trials > 0:
        collusion += measure_collusion_linking(linking_trials, scenario.seed)
    report = build_report(scenario, results, linking, collusion, measure_amplification())
    return finish(report, print_report, json_path, plot, plot_path)


def print_report(report: dict) -> None:
    caps = ":".join(f"{c:g}" for c in report["capacities"])
    attacker = ",".join(str(i) for i in report["attacker_nodes"])
    print(
        f"\ntraceless audit targeting  (capacities {caps}; attacker holds nodes {attacker}; "
        f"{report['requests_per_row']} target requests per row; "
        + (f"seed {report['seed']})" if report["seed"] is not None else "unseeded: the gateway uses its CSPRNG)")
    )
    print(
        f"{'policy':<17}{'router':<14}{'strategy':<14}{'T share':>8}{'P(target in T)':>16}{'95% CI':>17}"
        f"{'advantage':>11}{'chi2 p':>10}  verdict"
    )
    for r in report["results"]:
        lo, hi = r["p_95ci"]
        router = "simulated" if r["simulated"] else "REAL gateway"
        print(
            f"{r['policy']:<17}{router:<14}{r['strategy']:<14}{r['attacker_capacity_share']:>8.3f}"
            f"{r['p_target_in_T']:>16.3f}{f'[{lo:.3f}, {hi:.3f}]':>17}{r['advantage']:>10.2f}x"
            f"{r['chi_square_p_capacity_fit']:>10.2g}  {r['verdict']}"
        )
    summary = report["summary"]
    print(
        "T share: the attacker's capacity share, nodes it registered included. BEATS: the 95% interval lies "
        "above it (at 95%,\nabout one row in 40 that is truly at its share reads otherwise by chance). chi2 p: "
        "per-node counts vs capacity\nshares. Strategy 'none': the attacker does nothing; a simulated router "
        "off its share there is biased by itself."
    )
    print(
        f"ours beaten: {'YES' if summary['ours_beaten'] else 'no'}; simulated routers an attack beats: "
        f"{', '.join(summary['simulated_policies_beaten']) or 'none'}; off share without an attack: "
        f"{', '.join(summary['simulated_policies_off_share_without_attack']) or 'none'}"
    )
    if report.get("linking"):
        print(
            f"\n{'linking/log attack':<20}{'trials':>7}{'attack success':>16}{'95% CI':>17}"
            f"{'honest accepted':>17}{'95% CI':>17}  verdict"
        )
        for r in report["linking"]:
            (alo, ahi), (hlo, hhi) = r["attack_95ci"], r["honest_95ci"]
            print(
                f"{r['strategy']:<20}{r['trials']:>7}{r['attack_success_rate']:>16.3f}{f'[{alo:.3f}, {ahi:.3f}]':>17}"
                f"{r['honest_accept_rate']:>17.3f}{f'[{hlo:.3f}, {hhi:.3f}]':>17}  "
                f"{'detected / failed' if r['detected'] else 'ATTACK SUCCEEDED or honest refused'}"
            )

    if report.get("collusion"):
        print_collusion(report["collusion"])
    if report.get("amplification"):
        print_amplification(report["amplification"])


def print_collusion(rows: list[dict]) -> None:
    print(
        f"\n{'colluding hops':<16}{'fair':>7}{'honest baseline':>24}{'attack on ours':>24}"
        f"{'attack on weakened':>24}  verdict"
    )
    for r in rows:
        cells = "".join(_cell(r[k]) for k in ("honest", "attacked", "weakened"))
        print(f"{r['strategy']:<16}{r['fair']:>7.3f}{cells}  {'ok' if r['passed'] else 'FAILED'}")
    print(
        "Each cell: success rate, verdict against the fair level (99.99% Wilson interval). A row is ok when the "
        "honest\nbaseline is AT the fair level, the attack does not BEAT it on our client, and BEATS it on the "
        "weakened client."
    )


def _cell(c: dict) -> str:
    lo, hi = c["interval_99_99"]
    return f"{c['rate']:>8.3f} {c['verdict'][:5]:<5}{f'[{lo:.2f},{hi:.2f}]':>11}"


def plot(report: dict, path: str) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = report["results"]
    with figure(path, (max(8, 0.8 * len(rows)), 5)) as (fig, ax):
        _draw_targeting(ax, rows, Line2D, Patch)


def _draw_targeting(ax, rows: list[dict], Line2D, Patch) -> None:
    for x, r in enumerate(rows):
        p, (lo, hi) = r["p_target_in_T"], r["p_95ci"]
        colour = "tab:green" if not r["simulated"] else "tab:red" if r["verdict"] == BEATS else "tab:gray"
        ax.bar(x, p, color=colour, alpha=0.8)
        ax.errorbar(x, p, yerr=[[p - lo], [hi - p]], color="black", capsize=4)
        ax.hlines(r["attacker_capacity_share"], x - 0.45, x + 0.45, colors="tab:blue", linestyles="--")
    ax.legend(
        handles=[
            Line2D([], [], color="tab:blue", linestyle="--", label="attacker's capacity share (incl. registered)"),
            Patch(color="tab:green", label="ours: real gateway"),
            Patch(color="tab:red", label="simulated router: attacker beats its share"),
            Patch(color="tab:gray", label="simulated router: no attack / not beaten"),
        ],
        loc="upper left",
        fontsize=8,
    )
    ax.set_xticks(
        range(len(rows)), [f"{r['policy']}\n{r['strategy']}" for r in rows], rotation=35, ha="right", fontsize=8
    )
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("P(target's request lands on the attacker's nodes)")
    ax.set_title("Non-targetability: P(target in T) with 95% CI vs capacity share")
