"""The HTTP face of the proxy: module-level handlers that find the shared ``Runtime`` on
``request.app.state`` and the route table (``create_app`` in :mod:`skillstate.app.factory`
puts them together)."""
