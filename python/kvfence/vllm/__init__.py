"""kvfence as a vLLM KV connector (KVConnectorBase_V1), loaded by module path:

    --kv-transfer-config '{"kv_connector": "KVFenceConnector",
                           "kv_connector_module_path": "kvfence.vllm",
                           "kv_role": "kv_producer" | "kv_consumer"}'

See connector.py for the guarantees in vLLM's terms, layout.py for the
cache layouts, rendezvous.py for how peers find each other.
"""
from ._base import HAVE_VLLM
from .connector import KVFenceConnector, KVFenceConnectorMetadata, KVFenceHandshakeMetadata

__all__ = ["KVFenceConnector", "KVFenceConnectorMetadata", "KVFenceHandshakeMetadata", "HAVE_VLLM"]
