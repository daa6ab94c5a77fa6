"""Source of a small, valid third-party plugin, varied by the discovery tests."""

from __future__ import annotations

GOOD_PLUGIN = '''
from rlx_core import API_VERSION
from rlx_core.hookspecs import hookimpl
from rlx_core.records import BackendInfo, DeviceCaps, DeviceInfo, KernelClaim
import numpy as np

NAME = "{name}"
API = {api!r}

@hookimpl
def rlx_backend_info():
    return BackendInfo(name=NAME, version="1.0", api_version=API or API_VERSION)

@hookimpl
def rlx_probe_devices():
    caps = DeviceCaps(peak_flops={{"default": 1e9}}, mem_bandwidth=1e9, launch_overhead=1e-6)
    return [DeviceInfo(backend=NAME, name=NAME + ":0", available=True, caps=caps)]

def _add(ins, outs, attrs):
    a, b = ins
    o = outs[0]
    return lambda: np.add(a, b, out=o)

@hookimpl
def rlx_kernels(device):
    {kernels_body}
    return [KernelClaim("add", NAME + ".add", impl=_add, dtypes={{"f32"}})]

class _Prog:
    def __init__(self, program):
        self.program = program
    def run(self, inputs):
        env = dict(inputs)
        g = self.program.graph
        env.update({{p.name: g.weights[p.name] for p in g.params}})
        for s in self.program.kernels:
            out = np.empty(g.types[s.outputs[0]].shape, g.types[s.outputs[0]].dtype.np)
            _add([env[i] for i in s.inputs], [out], s.attrs)()
            env[s.outputs[0]] = out
        return env

@hookimpl
def rlx_compile(program, device):
    return _Prog(program)
'''


def plugin_source(name: str, *, api: str | None = None, kernels_body: str = "pass") -> str:
    return GOOD_PLUGIN.format(name=name, api=api, kernels_body=kernels_body)
