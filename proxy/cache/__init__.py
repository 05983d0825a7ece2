"""The response cache: exact-match answers of chat and messages requests, served without a
provider call (`service.ResponseCache`), kept in process or in Redis (`stores`)."""
