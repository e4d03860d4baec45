"""Tool calls: a request's tools (spec.py), the model's format read from its chat template
(formats.py), one streaming parser per format (hermes.py, json_lines.py for Llama 3 and the
generic fallback, mistral.py), events with schema validation (stream.py) and the grammar that
constrains a required call (grammar.py)."""
