"""Schedule model of the deterministic backward: tile orders, dQ addition ranks, DAG, SM timelines and ``auto``.

Pure Python + numpy (matplotlib only when drawing).  The CUDA kernels mirror :mod:`.orders`; :mod:`.tiles` is the single
source of truth for the backward tile shape.
"""

from .auto import MEASURED_PREFERENCES, MeasuredPreference, Prediction, choose_schedule, predict
from .costs import default_costs
from .dag import Dag, chains_dag, plan_dag
from .orders import SCHEDULES, applicable
from .plan import Plan, ScheduleError, build_plan
from .simulate import Deadlock, Timeline, critical_path, simulate
from .tiles import MASKS, TileGrid, bwd_tile_shape, fwd_tile_shape

__all__ = [
    "MASKS", "MEASURED_PREFERENCES", "SCHEDULES", "Dag", "Deadlock", "MeasuredPreference", "Plan", "Prediction",
    "ScheduleError", "TileGrid", "Timeline", "applicable", "build_plan", "bwd_tile_shape", "chains_dag",
    "choose_schedule", "critical_path", "default_costs", "fwd_tile_shape", "plan_dag", "predict", "simulate",
]
