"""The README's leaderboard command runs on any machine: without --out it writes beside the
committed table only when that table came from this machine, else to a folder named after this one."""

import json
import re

from zoo_bench.leaderboard import default_out
from zoo_bench.machine import device_name


def test_a_committed_table_from_another_machine_sends_the_sweep_to_this_machines_folder(tmp_path):
    assert default_out("lra_listops_quick", "cpu", tmp_path) == tmp_path / "cpu"
    saved = tmp_path / "cpu" / "leaderboard_lra_listops_quick.json"
    saved.parent.mkdir()
    saved.write_text(json.dumps({"protocol": {"device_name": "A CPU that is not this one"}}))
    mine = re.sub(r"[^a-z0-9]+", "-", device_name("cpu").lower()).strip("-")
    assert default_out("lra_listops_quick", "cpu", tmp_path) == tmp_path / f"cpu-{mine}"
    # another task's table does not move this one's sweep; this machine's own table is resumed in place
    assert default_out("lra_pathfinder32", "cpu", tmp_path) == tmp_path / "cpu"
    saved.write_text(json.dumps({"protocol": {"device_name": device_name("cpu")}}))
    assert default_out("lra_listops_quick", "cpu", tmp_path) == tmp_path / "cpu"
