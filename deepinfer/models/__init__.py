"""Model definitions, registered by architecture name through the ``deepinfer.models`` entry points."""
