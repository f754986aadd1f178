"""Report and figure fixes: the real last-level cache (not the flush size)."""

from roofline.measure.devices import last_level_cache_bytes
from roofline.report import plots


def _sysfs(root, caches):
    for i, (level, kind, size) in enumerate(caches):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")


def test_the_last_level_cache_is_read_from_sysfs(tmp_path):
    _sysfs(tmp_path, [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"), (3, "Unified", "32768K")])
    assert last_level_cache_bytes("cpu", str(tmp_path)) == 32 * 2**20
    assert last_level_cache_bytes("cpu", str(tmp_path / "none")) is None


def test_the_figure_marks_the_queried_cache_not_the_flush_size():
    ceilings = {"summary": {"mem_bw_GBps": 10.0, "peak_tflops": {"bfloat16": 1.0}, "cache_bytes": 64 * 2**20,
                            "llc_bytes": 32 * 2**20}}
    assert plots.roofs_for("bfloat16", ceilings, None).cache_bytes == 32 * 2**20
    flush_only = {"summary": {"mem_bw_GBps": 10.0, "peak_tflops": {}, "cache_bytes": 64 * 2**20}}
    assert plots.roofs_for("bfloat16", flush_only, None).cache_bytes is None
