"""The billing systems an exporter sends to, one module each; `make_sink` builds one from Settings."""
