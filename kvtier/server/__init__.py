"""`kvtier serve`: the OpenAI-compatible HTTP server (see README.md in this folder).

Entry points: `kvtier.server.app.build_app`, `kvtier.server.cli.add_serve_parser` and
`run_serve`. Nothing is imported here, so `kvtier --help` stays fast.
"""
