"""One module per algorithm; `registry` maps names to builders."""
