"""Alias of FlashMLA's module path, for code that imports ``flash_mla.flash_mla_interface`` directly."""

from ._interface import FlashMLASchedMeta, flash_mla_sparse_fwd, flash_mla_with_kvcache, get_mla_metadata

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd"]
