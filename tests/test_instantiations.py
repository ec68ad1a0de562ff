"""The variant table drives the generated files: they are current, the build knobs select from the table, the
generated C++ facts agree with the Python ones, and a new head dim is one table entry."""
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "hopper"))

import build_config  # noqa: E402
import generate  # noqa: E402  (hopper/generate.py)
from flash_attn_dash import variants  # noqa: E402
from host_cpp import build_host_program  # noqa: E402


def test_generated_files_are_current():
    result = subprocess.run([sys.executable, str(ROOT / "hopper" / "generate.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_build_config_selects_by_knobs(monkeypatch):
    monkeypatch.setenv("FLASH_DASH_HDIMS", "128")
    monkeypatch.setenv("FLASH_DASH_DTYPES", "bf16")
    monkeypatch.setenv("FLASH_DASH_PASSES", "bwd")
    assert build_config.kernel_sources() == ["hopper/generated/bwd_hdim128_bf16.cu"]
    assert build_config.compile_defines() == ["-DFLASH_DASH_HAS_BWD_HDIM128_BF16"]
    monkeypatch.delenv("FLASH_DASH_HDIMS")
    monkeypatch.delenv("FLASH_DASH_PASSES")
    defaults = [h for h in variants.HEAD_DIMS if h.default_build]
    assert len(build_config.kernel_sources()) == 2 * len(defaults)
    monkeypatch.setenv("FLASH_DASH_HDIMS", "80")
    table = ", ".join(h.build_name for h in variants.HEAD_DIMS)
    assert "192v128" in table
    with pytest.raises(ValueError, match=rf"FLASH_DASH_HDIMS='80': unsupported 80; .*\[{table}\]"):
        build_config.kernel_sources()


def test_build_config_names_a_v_head_dim_pair(monkeypatch):
    """FLASH_DASH_HDIMS names the MLA entry (qk 192, v 128) as 192v128; 192 alone is the (192, 192) entry."""
    monkeypatch.setenv("FLASH_DASH_DTYPES", "bf16")
    monkeypatch.setenv("FLASH_DASH_HDIMS", "192v128")
    assert build_config.kernel_sources() == ["hopper/generated/fwd_hdim192v128_bf16.cu",
                                             "hopper/generated/bwd_hdim192v128_bf16.cu"]
    assert build_config.compile_defines() == ["-DFLASH_DASH_HAS_FWD_HDIM192V128_BF16",
                                              "-DFLASH_DASH_HAS_BWD_HDIM192V128_BF16"]
    monkeypatch.setenv("FLASH_DASH_HDIMS", "192")
    assert build_config.kernel_sources() == ["hopper/generated/fwd_hdim192_bf16.cu",
                                             "hopper/generated/bwd_hdim192_bf16.cu"]
    monkeypatch.setenv("FLASH_DASH_HDIMS", "192,128v192")
    with pytest.raises(ValueError, match="unsupported 128v192"):
        build_config.kernel_sources()


def test_v_head_dim_reaches_the_generated_units():
    """The MLA entry's units pass its V head dim as the traits' last argument and its kernel-table lines carry both
    head dims; the equal-dim units keep the traits' default (their kernels are unchanged)."""
    files = generate.files()
    fwd = files[generate.GENERATED / "fwd_hdim192v128_bf16.cu"]
    bwd = files[generate.GENERATED / "bwd_hdim192v128_bf16.cu"]
    assert "FwdKernelTraits<192, 128, 128, 2, cutlass::bfloat16_t, 1, true, 128>" in fwd
    assert "BwdTraits<cutlass::bfloat16_t, 192, 64, 96, 24, 240, 2, 1, true, 128>" in bwd
    assert "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" in bwd  # keys split in halves of 48
    assert '{"fwd_hdim192v128_bf16", 192, 128, at::kBFloat16' in files[generate.KERNEL_TABLE]
    assert "BwdTraits<cutlass::bfloat16_t, 192, 64, 96, 24, 240, 2, 1, true>" in \
        files[generate.GENERATED / "bwd_hdim192_bf16.cu"]


def test_every_selected_source_is_generated():
    for src in build_config.kernel_sources():
        assert (ROOT / src).is_file(), src


SCHEDULE_FACTS_CPP = r"""
#include <cstdio>
#include "generated/schedule_ids.h"
using namespace flash_dash;
int main() {
    std::printf("%d\n", kNumSchedules);
    for (int i = 0; i < kNumSchedules; ++i) {
        Schedule s = static_cast<Schedule>(i);
        std::printf("%d %s %d %d\n", i, schedule_name(s), mask_mismatch(s, false) == nullptr,
                    mask_mismatch(s, true) == nullptr);
    }
}
"""


def test_generated_schedule_ids_match_the_table(tmp_path_factory):
    exe = build_host_program(tmp_path_factory, "schedule_facts", SCHEDULE_FACTS_CPP)
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    assert int(lines[0]) == len(variants.SCHEDULES)
    for line, s in zip(lines[1:], sorted(variants.SCHEDULES, key=lambda s: s.id)):
        sid, name, full, causal = line.split()
        assert (int(sid), name) == (s.id, s.name)
        assert (full == "1", causal == "1") == ("full" in s.masks, "causal" in s.masks)


def test_a_new_head_dim_is_one_table_entry(monkeypatch):
    """Head dim 96 is one HeadDim entry (the 128 configurations): without it the generator writes exactly its four
    translation units and its kernel-table lines fewer. An entry with default_build=False (one whose kernels have not
    passed the GPU tests yet) is compiled only when FLASH_DASH_HDIMS names it."""
    with_96 = generate.files()
    h96 = variants.head_dim(96)
    assert variants.bwd_tile(96) == variants.bwd_tile(128)
    assert h96.fwd_full == variants.head_dim(128).fwd_full
    monkeypatch.setattr(variants, "HEAD_DIMS", tuple(h for h in variants.HEAD_DIMS if h.qk != 96))
    without = generate.files()
    assert {p.name for p in with_96} - {p.name for p in without} == {
        f"{p}_hdim96_{d}.cu" for p in variants.PASSES for d in variants.DTYPES}
    assert {p for p in without if without[p] != with_96[p]} == {generate.KERNEL_TABLE}
    table = with_96[generate.KERNEL_TABLE]
    for d in variants.DTYPES:
        assert f'{{"fwd_hdim96_{d}", 96, 96,' in table and f"&run_bwd_hdim96_{d}" in table
    assert "FwdKernelTraits<96, 128, 128, 2," in with_96[generate.GENERATED / "fwd_hdim96_bf16.cu"]
    assert "BwdTraits<cutlass::bfloat16_t, 96, 64, 128, 40, 232>" in with_96[generate.GENERATED / "bwd_hdim96_bf16.cu"]
    monkeypatch.undo()
    hdim96_sources = [f"hopper/generated/{p}_hdim96_{d}.cu" for p in variants.PASSES for d in variants.DTYPES]
    assert h96.default_build and set(hdim96_sources) <= set(build_config.kernel_sources())
    monkeypatch.setattr(variants, "HEAD_DIMS", tuple(dataclasses.replace(h, default_build=h.qk != 96)
                                                     for h in variants.HEAD_DIMS))
    assert not any("hdim96" in src for src in build_config.kernel_sources())
    monkeypatch.setenv("FLASH_DASH_HDIMS", "96")
    assert build_config.kernel_sources() == hdim96_sources


SOFTCAP_FACTS_CPP = r"""
#include <cmath>
#include <cstdio>
#include "common/softcap.hpp"
using namespace flash_dash;
int main() {
    float const caps[] = {0.f, 30.f, -1.f, INFINITY, NAN};
    for (float c : caps) {
        for (int w = 0; w < 2; ++w) {
            for (int s = 0; s < 2; ++s) {
                char const* why = softcap_error(c, w, s);
                std::printf("%d %d %s\n", w, s, why ? why : "ok");
            }
        }
    }
}
"""


def test_softcap_kernels_are_the_tables(tmp_path_factory, monkeypatch):
    """variants.SOFTCAP_WITH drives the launchers' softcap_error (generated/features.h, compiled on the host) and the
    API's refusal alike: a softcap runs alone, with a sliding window or a sink only where the table builds it (the
    a bad value is refused by both. Taking "window" out of the table changes only the generated features header."""
    from flash_attn_dash import features

    exe = build_host_program(tmp_path_factory, "softcap_facts", SOFTCAP_FACTS_CPP)
    rows = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    for cap, block in zip((0.0, 30.0, -1.0, float("inf"), float("nan")), (rows[i:i + 4] for i in range(0, 20, 4))):
        for row in block:
            window, sink, why = row.split(" ", 2)
            window, sink = window == "1", sink == "1"
            if cap < 0 or cap != cap or cap == float("inf"):
                assert why == "flash_dash: softcap must be finite and >= 0"
                with pytest.raises(ValueError, match="softcap must be finite and >= 0"):
                    features.check_softcap(cap)
                continue
            refusal = features.kernel_refusal(cap, (64, 0) if window else None, has_sink=sink)
            assert (why == "ok") == (refusal is None), (cap, window, sink, why, refusal)
            assert (why == "ok") == (cap == 0 or ((not window or "window" in variants.SOFTCAP_WITH)
                                                  and (not sink or "sink" in variants.SOFTCAP_WITH)))
    before = generate.files()
    assert "constexpr bool kSoftcapWithWindow = true;" in before[generate.GENERATED / "features.h"]
    monkeypatch.setattr(variants, "SOFTCAP_WITH", ())
    after = generate.files()
    assert {p for p in after if after[p] != before[p]} == {generate.GENERATED / "features.h"}
    assert "constexpr bool kSoftcapWithWindow = false;" in after[generate.GENERATED / "features.h"]
    assert "with a sliding window (no softcap kernel" in features.kernel_refusal(30.0, (64, 0))
    assert "with a learnable_sink" in features.kernel_refusal(30.0, has_sink=True)


def test_source_digest_follows_the_unit_the_headers_and_the_flags(monkeypatch, tmp_path):
    """The stamp setup.py checks before linking a prebuilt object: it must change with anything the object is
    compiled from, or a stale object would be linked."""
    (tmp_path / "hopper" / "generated").mkdir(parents=True)
    (tmp_path / "hopper" / "bwd").mkdir()
    unit, other = (tmp_path / "hopper" / "generated" / f"{n}.cu" for n in ("a", "b"))
    header = tmp_path / "hopper" / "bwd" / "mainloop.hpp"
    unit.write_text('#include "bwd/mainloop.hpp"\n')
    other.write_text('#include "fwd/mainloop.hpp"\n')
    header.write_text("// v1\n")
    monkeypatch.setattr(build_config, "ROOT", tmp_path)
    first = build_config.source_digest("hopper/generated/a.cu")
    assert build_config.source_digest("hopper/generated/a.cu") == first
    assert build_config.source_digest("hopper/generated/b.cu") != first
    header.write_text("// v2\n")
    edited = build_config.source_digest("hopper/generated/a.cu")
    assert edited != first
    flags = build_config.nvcc_flags()
    monkeypatch.setattr(build_config, "nvcc_flags", lambda: [*flags, "-G"])
    assert build_config.source_digest("hopper/generated/a.cu") != edited
