"""The Gantry web console: every service's state in a browser, as far as the viewer's role may
see it. Pages are rendered on the server (Jinja2) and refreshed in place with htmx; charts are
SVG drawn on the server, so the browser runs no application code and loads nothing from the
network. The console holds no state of its own: each page calls the services' public APIs with
the viewer's own token, so the services' RBAC decides what comes back."""
