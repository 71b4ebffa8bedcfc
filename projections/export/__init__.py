"""Exactly-once export of sealed usage to billing systems (`ledgerlm export --sink S`)."""
