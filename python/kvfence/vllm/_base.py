"""vLLM's connector base classes when vLLM is importable, else stand-ins
with the same names and the same constructor, so the connector runs (and
is tested) on a machine without vLLM or torch. Nothing here moves KV."""
import enum
from abc import ABC

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401
        KVConnectorBase_V1, KVConnectorHandshakeMetadata, KVConnectorMetadata, KVConnectorRole, SupportsHMA)
    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorHandshakeMetadata(ABC):  # noqa: B024
        pass

    class KVConnectorMetadata(ABC):  # noqa: B024
        pass

    class SupportsHMA(ABC):  # noqa: B024
        pass

    class KVConnectorBase_V1(ABC):  # noqa: B024
        """vLLM's constructor and metadata binding (base.py at 9aaf83ef)."""

        def __init__(self, vllm_config, role, kv_cache_config):
            self._connector_metadata = None
            self._vllm_config = vllm_config
            if vllm_config.kv_transfer_config is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self):
            return self._connector_metadata is not None
