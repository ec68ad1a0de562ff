"""``flash-attn-dash plan --png``: one shared time axis, a title naming the shape and the CTAs drawn, readable colours
and a capped image size (read back from :class:`~flash_attn_dash.schedule.draw.GanttFigure` and the PNG header)."""

from __future__ import annotations

import itertools
import json
import struct

import pytest

from flash_attn_dash import cli
from flash_attn_dash.cli import main
from flash_attn_dash.schedule import draw
from flash_attn_dash.schedule.auto import predict


def _png_size(path) -> tuple[int, int]:
    """``(width, height)`` from a PNG's IHDR chunk."""
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _plan_png(argv: list[str], tmp_path, monkeypatch, capsys) -> tuple[draw.GanttFigure, dict]:
    """Run ``plan --json --png`` with ``argv`` added; return what was drawn and the JSON numbers."""
    drawn: list[draw.GanttFigure] = []

    def record(*args, **kwargs) -> draw.GanttFigure:
        drawn.append(draw.draw_gantt(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(cli, "draw_gantt", record)
    path = tmp_path / "plan.png"
    assert main(["plan", *argv, "--json", "--png", str(path)]) == 0
    data = json.loads(capsys.readouterr().out)  # --json stays pure JSON with --png
    assert len(drawn) == 1 and _png_size(path) == drawn[0].size_px
    return drawn[0], data


def test_panels_share_one_axis_in_microseconds(tmp_path, monkeypatch, capsys):
    fig, data = _plan_png(["--seqlen", "2048", "--hdim", "64", "--causal"], tmp_path, monkeypatch, capsys)
    makespans_us = [s["makespan"] / 1e3 for s in data["schedules"]]
    assert len(set(makespans_us)) > 1  # the schedules differ, so per-panel autoscaling would differ too
    assert len(fig.xlims) == len(makespans_us) and len(set(fig.xlims)) == 1
    low, high = fig.xlims[0]
    assert low == 0 and max(makespans_us) < high <= 1.02 * max(makespans_us)
    assert fig.xlabel == "time (µs)"
    for title, s in zip(fig.panel_titles, data["schedules"]):
        assert title.startswith(s["schedule"]) and f"{s['speedup_over_ascending']:.3f}x vs ascending" in title
        assert f"makespan {s['makespan'] / 1e3:.5g} µs" in title


def test_given_costs_use_model_time_units(tmp_path, monkeypatch, capsys):
    fig, data = _plan_png(["--seqlen", "1024", "--hdim", "64", "--c", "3", "--r", "1"], tmp_path, monkeypatch, capsys)
    assert fig.xlabel == "time (model time units)"
    high = max(s["makespan"] for s in data["schedules"])
    assert len(set(fig.xlims)) == 1 and fig.xlims[0] == (0.0, pytest.approx(1.01 * high))


def test_title_names_shape_and_sampled_ctas(tmp_path, monkeypatch, capsys):
    fig, data = _plan_png(["--seqlen", "2048", "--hdim", "64", "--causal", "--sm-margin", "2"],
                          tmp_path, monkeypatch, capsys)
    heading, shown = fig.title.split("\n")
    for part in ("causal mask", "seqlen_q/seqlen_k 2048/2048", "hdim 64", "batch 8", "heads 32",
                 "grid 130 (132 SMs - margin 2)"):
        assert part in heading
    rows = draw.sample_ctas(130, 16)
    assert fig.rows == (tuple(rows),) * len(data["schedules"]) and len(rows) == 16
    assert shown == f"CTAs 0, {rows[1]}, {rows[2]}, …, 129 of 130 shown"


def test_all_ctas_named_when_not_sampled(tmp_path, monkeypatch, capsys):
    fig, _ = _plan_png(["--seqlen", "512", "--hdim", "128", "--batch", "1", "--heads", "2", "--max-ctas", "50"],
                       tmp_path, monkeypatch, capsys)
    assert fig.title.endswith("\nall 8 CTAs shown") and fig.rows[0] == tuple(range(8))


def test_describe_ctas():
    assert draw.describe_ctas([0, 1, 2], 3) == "all 3 CTAs shown"
    assert draw.describe_ctas([0], 1) == "all 1 CTA shown"
    assert draw.describe_ctas([0, 5, 9], 10) == "CTAs 0, 5, 9 of 10 shown"
    assert draw.describe_ctas(draw.sample_ctas(132, 16), 132) == "CTAs 0, 9, 17, …, 131 of 132 shown"


def test_panels_on_different_grids_name_their_own_ctas(tmp_path):
    timelines = [predict("causal", 64, 512, 512, 1, 4, sms)[0].timeline for sms in (8, 16)]
    fig = draw.draw_gantt(timelines, ["small grid", "large grid"], str(tmp_path / "x.png"), "two grids", max_ctas=6)
    assert fig.title == "two grids\nup to 6 CTAs per panel, sampled evenly (listed per panel)"
    assert [t.plan.num_ctas for t in timelines] == [8, 16]
    assert fig.panel_titles[0].endswith("; CTAs 0, 1, 3, …, 7 of 8 shown")
    assert fig.panel_titles[1].endswith("; CTAs 0, 3, 6, …, 15 of 16 shown")
    assert len(set(fig.xlims)) == 1


def _rgb(colour: str) -> tuple[int, ...]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def test_colours_are_few_and_clearly_different(tmp_path, monkeypatch, capsys):
    fig, _ = _plan_png(["--seqlen", "1024", "--hdim", "64"], tmp_path, monkeypatch, capsys)
    labels = [label for label, _ in fig.legend]
    colours = [colour.lower() for _, colour in fig.legend]
    assert labels[-2:] == ["dQ reduce", "wait for rank predecessor"]
    assert labels[:2] == ["heads 0, 5, …", "heads 1, 6, …"]  # 16 x 16 heads over five colours
    assert 2 <= len(draw.COMPUTE_COLOURS) <= 6 and colours[:-2] == [c.lower() for c in draw.COMPUTE_COLOURS]
    for a, b in itertools.combinations(colours, 2):  # every pair far apart in RGB, reduce and wait included
        assert sum((x - y) ** 2 for x, y in zip(_rgb(a), _rgb(b))) ** 0.5 > 60, (a, b)


def test_head_labels():
    assert draw._head_labels(3) == ["head 0", "head 1", "head 2"]
    assert draw._head_labels(7) == ["heads 0, 5", "heads 1, 6", "head 2", "head 3", "head 4"]
    assert draw._head_labels(11)[0] == "heads 0, 5, …" and draw._head_labels(11)[1] == "heads 1, 6"


def test_image_size_is_capped(tmp_path, monkeypatch, capsys):
    shape = ["--seqlen", "1024", "--hdim", "64", "--batch", "2", "--heads", "8"]
    small, _ = _plan_png([*shape, "--max-ctas", "4"], tmp_path, monkeypatch, capsys)
    large, data = _plan_png([*shape, "--max-ctas", "1000"], tmp_path, monkeypatch, capsys)
    assert [len(rows) for rows in small.rows] == [4, 4, 4]
    assert [len(rows) for rows in large.rows] == [s["num_ctas"] for s in data["schedules"]]  # every CTA drawn
    assert small.size_px[0] == large.size_px[0] == draw.MAX_PNG_PX[0]
    assert small.size_px[1] < large.size_px[1] == draw.MAX_PNG_PX[1]


def test_help_documents_the_cap(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert " ".join(capsys.readouterr().out.split()).count(f"{draw.MAX_PNG_PX[0]} x {draw.MAX_PNG_PX[1]} pixels") == 1
