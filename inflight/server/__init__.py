"""OpenAI-compatible HTTP server: protocol (pydantic), serving (handlers), api_server (app)."""
