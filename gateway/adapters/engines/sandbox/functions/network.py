"""Terraform's IP network functions: cidrhost, cidrnetmask, cidrsubnet, cidrsubnets."""

from __future__ import annotations

import ipaddress

from gateway.adapters.engines.sandbox.functions.registry import (
    FunctionError,
    Num,
    function,
    whole,
)


def _network(prefix: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(prefix, strict=False)
    except ValueError:
        raise FunctionError(f"invalid CIDR expression: {prefix}", 0) from None


@function()
def _cidrhost(prefix: str, hostnum: Num) -> str:
    network = _network(prefix)
    host = whole(hostnum)
    if not -network.num_addresses <= host < network.num_addresses:
        raise FunctionError(f"prefix of {network.prefixlen} does not accommodate a host numbered {host}", 1)
    return str(network[host])


@function()
def _cidrnetmask(prefix: str) -> str:
    network = _network(prefix)
    if network.version != 4:
        raise FunctionError("only IPv4 networks are supported", 0)
    return str(network.netmask)


@function()
def _cidrsubnet(prefix: str, newbits: Num, netnum: Num) -> str:
    network = _network(prefix)
    bits, num = whole(newbits), whole(netnum)
    length = network.prefixlen + bits
    if bits < 0 or length > network.max_prefixlen:
        raise FunctionError(f"insufficient address space to extend prefix of {network.prefixlen} by {bits}", 1)
    if not 0 <= num < 2 ** bits:
        raise FunctionError(f"prefix extension of {bits} does not accommodate a subnet numbered {num}", 2)
    return f"{network.network_address + (num << (network.max_prefixlen - length))}/{length}"


@function()
def _cidrsubnets(prefix: str, *newbits: Num) -> list[str]:
    network = _network(prefix)
    out: list[str] = []
    start = int(network.network_address)
    end = start + network.num_addresses
    for i, bits in enumerate(whole(b) for b in newbits):
        length = network.prefixlen + bits
        if bits < 1 or length > network.max_prefixlen:
            raise FunctionError(f"would extend prefix to {length} bits, which is too long for an "
                                f"IPv{network.version} address", i + 1)
        size = 1 << (network.max_prefixlen - length)
        start = -(-start // size) * size  # the next boundary of this size
        if start + size > end:
            raise FunctionError(f"not enough remaining address space for a subnet with a prefix of {length} bits "
                                f"after {out[-1] if out else prefix}", i + 1)
        out.append(f"{ipaddress.ip_address(start) if network.version == 4 else ipaddress.IPv6Address(start)}/{length}")
        start += size
    return out
