def add_tool_commands(sub):
    pass
