"""The example shop app: its shop_demo command enqueues receipts and shows their deliveries."""

from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "example_project.shop"
    label = "shop"
