import time
from types import SimpleNamespace

import pytest

from kvtier.bench.gpu_monitor import GpuMonitor, GpuSample, _integrate_power


class FakeNvml:
    """pynvml's calls used by the monitor, with an energy counter that grows 200 W."""

    def __init__(self, has_energy=True):
        self.has_energy, self.t0 = has_energy, time.monotonic()

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlDeviceGetName(self, h):
        return b"Fake H200"

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=80, memory=30)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=5 << 30, total=141 << 30)

    NVML_CLOCK_SM = 1

    def nvmlDeviceGetPowerUsage(self, h):
        return 200_000  # mW

    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if not self.has_energy:
            raise RuntimeError("not supported")
        return int((time.monotonic() - self.t0) * 200_000)  # mJ


@pytest.mark.parametrize("has_energy", [True, False])
def test_samples_and_energy(has_energy):
    mon = GpuMonitor(FakeNvml(has_energy), index=0, interval_s=0.01)
    mon.start()
    time.sleep(0.2)
    s = mon.stop()
    assert s.device_name == "Fake H200" and len(s.samples) >= 5
    assert s.mean_gpu_util_pct == 80 and s.mean_power_w == 200 and s.max_mem_used_bytes == 5 << 30
    assert s.mean_sm_clock_mhz == 1980
    assert s.energy_j == pytest.approx(200 * 0.2, rel=0.25)
    d = s.to_dict(output_tokens=100)
    assert d["energy_per_output_token_j"] == pytest.approx(s.energy_j / 100)


def test_integrate_power_trapezoid():
    samples = [GpuSample(0.0, 0, 0, 100.0), GpuSample(1.0, 0, 0, 300.0), GpuSample(3.0, 0, 0, 300.0)]
    assert _integrate_power(samples) == pytest.approx(200.0 + 600.0)


def test_create_matches_gpu_presence():
    torch = pytest.importorskip("torch")
    mon = GpuMonitor.create()
    if torch.cuda.is_available():
        assert isinstance(mon, GpuMonitor)
    else:
        assert mon is None  # no GPU: no monitor, and no exception
