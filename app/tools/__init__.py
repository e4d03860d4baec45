"""Tools the model can call from the app: built-in ones (builtin.py; all run without asking but
fetch_url, which reaches the network) and tools of MCP servers the user adds (mcp_client.py).
Nothing here imports Qt: the chat integration runs these on a worker thread and shows their
ToolResult."""
