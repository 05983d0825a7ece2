"""OpenAI's Responses API through the gateway: the exchange, stored responses, sealed ids."""
