"""Chip keys of the multi-core seam: shared DDR/L2/message queue vs per-core ports, --cores bounds."""

import pytest

from tpuflow.chip import chip_from_dict, load_chip
from tpuflow.errors import ConfigError


def test_sg2260_shares_ddr_l2_and_messages_between_its_cores():
    chip = load_chip("sg2260")
    assert chip.core.cores == 8 and chip.core.message_ids == 512
    assert chip.core.l2_sram_bytes == 128 << 20 and chip.core.l2_sram_gbps == 128.0
    # one core's port vs the UMCs all cores share: 16 UMC x 32 B x 400 MHz
    assert chip.ddr_peak_bytes_per_second == pytest.approx(68.264e9)
    assert chip.ddr_chip_peak_bytes_per_second == pytest.approx(16 * 32 * 400e6)


@pytest.mark.parametrize("cores", [0, 9, -1])
def test_cores_outside_the_chip_name_the_key(cores):
    with pytest.raises(ConfigError, match="core.cores"):
        load_chip("sg2260").check_cores(cores)


def test_chip_total_below_one_port_is_refused_and_zero_means_every_port():
    with pytest.raises(ConfigError, match="dram.chip_peak_gbps"):
        chip_from_dict({"base": "sg2260", "dram": {"chip_peak_gbps": 10.0}})
    chip = chip_from_dict({"base": "sg2260", "dram": {"chip_peak_gbps": 0.0}})
    assert chip.ddr_chip_peak_bytes_per_second == pytest.approx(8 * 68.264e9)
