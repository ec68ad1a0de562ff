"""Schedule model of the deterministic backward: tile orders, dQ addition ranks, DAG, SM timelines and ``auto``, on
the full and causal masks and on sliding-window bands, for one call or a varlen pack sharing one grid
(:mod:`.packs`, :mod:`.pack_orders`, :mod:`.pack_plan`).

Pure Python + numpy (matplotlib only when drawing). The CUDA policies (``hopper/schedule/policies.hpp``) mirror
:mod:`.orders`; tile shapes and schedule names come from :mod:`flash_attn_dash.variants`.
"""

from .auto import (BAND_SCHEDULE, MEASURED_PREFERENCES, MeasuredPreference, Prediction, auto_reason, auto_schedule,
                   model_choice, predict, predict_pack, rule_schedule)
from .costs import default_costs
from .dag import Dag, chains_dag, plan_dag
from .orders import SCHEDULES, applicable
from .pack_plan import PackPlan, build_pack_plan
from .packs import PackTiles
from .plan import Plan, ScheduleError, build_plan
from .simulate import Deadlock, Timeline, critical_path, simulate
from .tiles import MASKS, TileGrid, bwd_tile_shape, canonical_window

__all__ = [
    "BAND_SCHEDULE", "MASKS", "MEASURED_PREFERENCES", "SCHEDULES", "Dag", "Deadlock", "MeasuredPreference",
    "PackPlan", "PackTiles", "Plan", "Prediction", "ScheduleError", "TileGrid", "Timeline", "applicable",
    "auto_reason", "auto_schedule", "build_pack_plan", "build_plan", "bwd_tile_shape", "canonical_window",
    "chains_dag", "critical_path", "default_costs", "model_choice", "plan_dag", "predict", "predict_pack",
    "rule_schedule", "simulate",
]
