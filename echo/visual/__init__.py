"""What a person looks at: the timeline and the heat map as a Perfetto trace, PNGs and an HTML report.

Every picture is drawn from the JSON of :class:`rankecho.echo.mcp.timeline.Timeline` and of
find_stragglers (the analysis' own views), never from SQL of its own, so the picture, the MCP answer and
``rankecho diagnose`` always agree.
"""
