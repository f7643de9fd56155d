"""`deepinfer plugins list`: every discovered plugin and whether it can load here."""
from __future__ import annotations

from dataclasses import dataclass

from deepinfer.plugins.discovery import (
    ALLOW_ENV,
    MODELS_GROUP,
    PluginError,
    allow_list,
    allowed_entry_point,
    discover,
    distribution_of,
    load,
    model_entry_points,
)
from deepinfer.plugins.hookcheck import hook_problems


@dataclass(frozen=True, slots=True)
class PluginStatus:
    name: str
    slot: str
    distribution: str
    status: str  # "ok" or the reason it cannot load

    @property
    def ok(self) -> bool:
        return self.status == "ok"


#: the status of an entry point that DEEPINFER_PLUGINS leaves out (not imported, so not checked)
EXCLUDED = f"excluded by {ALLOW_ENV} (not imported)"


def plugin_statuses() -> list[PluginStatus]:
    out = []
    allowed = allow_list()
    for info in discover(respect_allow_list=False):
        if not allowed_entry_point(info.entry_point, allowed):
            out.append(PluginStatus(info.name, info.slot.name, info.distribution, EXCLUDED))
            continue
        try:
            cls = load(info)
            reason = cls.unavailable_reason() if hasattr(cls, "unavailable_reason") else None
            if reason is None and (problems := hook_problems(cls)):  # (slot plugins may implement hooks too)
                reason = "hooks do not match the specs: " + "; ".join(problems)
        except PluginError as e:
            reason = str(e)
        except Exception as e:  # noqa: BLE001 (a plugin's own availability check crashed: report, don't die)
            reason = f"availability check failed: {type(e).__name__}: {e}"
        out.append(PluginStatus(info.name, info.slot.name, info.distribution, reason or "ok"))
    for ep in model_entry_points(respect_allow_list=False):  # (by config.json's name: imported to check)
        if not allowed_entry_point(ep, allowed):
            out.append(PluginStatus(ep.name, "model", distribution_of(MODELS_GROUP, ep), EXCLUDED))
            continue
        try:
            ep.load()
            reason = None
        except Exception as e:  # noqa: BLE001 (reported, as the engine reports it for that architecture)
            reason = f"failed to load: {type(e).__name__}: {e}"
        out.append(PluginStatus(ep.name, "model", distribution_of(MODELS_GROUP, ep), reason or "ok"))
    return sorted(out, key=lambda s: (s.slot, s.name))


def format_table(rows: list[PluginStatus]) -> str:
    head = ("NAME", "SLOT", "DISTRIBUTION", "STATUS")
    cols = [head] + [(r.name, r.slot, r.distribution, r.status) for r in rows]
    widths = [max(len(c[i]) for c in cols) for i in range(3)]
    return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}" for a, b, c, d in cols)
