"""Real servers the network tests start on 127.0.0.1, and the helpers that start them."""
