"""The custom search attributes the Web UI's list view filters conversations by (CONTRACT.md)."""

from __future__ import annotations

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode

AGENT_STATUS = SearchAttributeKey.for_keyword("AgentStatus")
TENANT_ID = SearchAttributeKey.for_keyword("TenantId")
AGENT_NAME = SearchAttributeKey.for_keyword("AgentName")
ALL = (AGENT_STATUS, TENANT_ID, AGENT_NAME)


async def ensure_registered(client: Client, namespace: str) -> None:
    """Register the attributes that are missing (a dev server's SQLite file may predate one)."""
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        missing = {k.name for k in ALL} - set(listed.custom_attributes)
    except RPCError as err:  # the time-skipping test server can add attributes but not list them
        if err.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        missing = {k.name for k in ALL}
    if missing:
        keyword = IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=namespace, search_attributes={name: keyword for name in missing}
            )
        )
